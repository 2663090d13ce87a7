"""Protocol v1: framing, validation, and the codec's answer to bad input (pure functions)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vramscope.agent.ingest import protocol as proto
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Event, Holder, Phase, PostMortem, Sample
from vramscope.agent.trace import record_from_json


def _payloads(data: bytes, max_bytes: int = 1024) -> tuple[list[bytes], bytearray]:
    buf = bytearray(data)
    return proto.split_frames(buf, max_bytes), buf


def test_frame_is_big_endian_length_then_compact_json():
    data = proto.frame({"type": "status"})
    assert data == b"\x00\x00\x00\x11" + b'{"type":"status"}'


def test_split_frames_returns_complete_frames_and_keeps_the_partial_one():
    a, b = proto.frame({"type": "status"}), proto.dropped_message(3)
    frames, rest = _payloads(a + b + b[:5])
    assert frames == [a[4:], b[4:]]
    assert rest == bytearray(b[:5])


def test_split_frames_refuses_a_length_above_the_cap_as_fatal():
    with pytest.raises(proto.ProtocolError) as err:
        _payloads(b"\x00\x00\x04\x01" + b"x" * 10, max_bytes=1024)
    assert err.value.fatal and err.value.reason == "oversized"
    assert "1025 bytes exceeds the cap of 1024" in str(err.value)


def test_records_round_trip_through_the_trace_v1_validator():
    s = Sample(1.5, 1, Phase.DECODE, "torch", 42, allocated_bytes=100, reserved_bytes=200)
    e = Event(2.0, "request_end", 1, 42, Phase.IDLE, "r7", {"tokens": 5})
    obj = proto.decode(proto.records_message([s, e])[4:])
    assert proto.parse_records(obj) == [s, e]


def test_hello_with_the_wrong_version_is_fatal_and_names_both_versions():
    obj = proto.decode(proto.hello(1, "srv", [0], protocol=99)[4:])
    with pytest.raises(proto.ProtocolError) as err:
        proto.parse_hello(obj)
    assert err.value.fatal and err.value.reason == "version"
    assert str(err.value) == ("protocol version 99 is not supported; this agent speaks "
                              "version 1 (an integer)")


def test_hello_fields_are_parsed():
    obj = proto.decode(proto.hello(7, "vllm", [0, 3], model="llama")[4:])
    assert proto.parse_hello(obj) == proto.Hello(1, 7, "vllm", (0, 3), "llama")


@pytest.mark.parametrize("payload, reason, text", [
    (b"\xff\xfe", "json", "not valid UTF-8 JSON"),
    (b"[1, 2]", "schema", "must be a JSON object, got list"),
    (b'{"type": "nope"}', "schema", "unknown message type 'nope'"),
    (b'{"type": "records", "records": 5}', "schema", "'records' must be a list"),
    (b'{"type": "records", "records": [{"ts": NaN}]}', "json", "NaN is not allowed"),
    (b'{"type": "records", "records": [7]}', "schema", "record 0: expected an object"),
])
def test_decode_and_parse_reject_bad_payloads_with_a_reason(payload, reason, text):
    with pytest.raises(proto.ProtocolError) as err:
        proto.parse_records(proto.decode(payload))
    assert err.value.reason == reason and not err.value.fatal
    assert text in str(err.value)


@pytest.mark.parametrize("record, text", [
    ({"device": 0}, "record 0: missing required key 'ts'"),
    ({"ts": 1, "allocated_bytes": -1}, "record 0: 'allocated_bytes' must be >= 0, got -1"),
    ({"ts": 1, "phase": "lunch"}, "record 0: unknown phase 'lunch'"),
    ({"ts": 1, "allocated_bytes": 2**64}, "'allocated_bytes' is too large"),
    ({"ts": 1, "device": 2**31}, "'device' is too large (at most 2147483647), got 2147483648"),
    ({"ts": 1, "event": "x" * 65}, "'event' is longer than 64 characters (65)"),
    ({"ts": 1, "source": "\ud800"}, "'source' is not valid Unicode (a lone surrogate)"),
    ({"ts": 1, "host": "a\udfffb"}, "'host' is not valid Unicode"),
    ({"ts": 1, "event": "x", "request_id": "\ud800"}, "'request_id' is not valid Unicode"),
    ({"ts": 1, "event": "x", "note": "\ud800"}, "event data value '\\ud800' is not valid"),
    ({"ts": 1, "event": "x", "\udc00": 1}, "event data key '\\udc00' is not valid"),
    ({"ts": 1, "pid": 2**63}, "'pid' is too large (at most 2147483647)"),
    ({"ts": 10**400}, "'ts' must be a finite number of seconds, got 1000000000000000000000"),
    ({"ts": 1, "source": "s" * 33}, "'source' is longer than 32 characters (33)"),
])
def test_records_are_validated_with_the_store_limits(record, text):
    with pytest.raises(proto.ProtocolError) as err:
        proto.parse_records({"type": "records", "records": [record]})
    assert text in str(err.value)


def test_postmortem_round_trip_and_validation():
    pm = PostMortem(3.0, 0, 9, Phase.PREFILL, 1 << 30, 1 << 20, 80 << 30, 70 << 30, 79 << 30,
                    1 << 29, 0.4, ("r1",), (Holder(5 << 30, ("a.py:1:f",), Phase.DECODE),))
    obj = json.loads(proto.postmortem_message(pm)[4:])
    assert proto.parse_postmortem(obj) == pm
    obj["postmortem"]["ts_s"] = "soon"
    with pytest.raises(proto.ProtocolError, match="post-mortem: 'ts_s' must be a number, got "
                       "'soon'"):
        proto.parse_postmortem(obj)
    obj["postmortem"]["ts_s"] = 1e12  # year 33658: no page could show it
    with pytest.raises(proto.ProtocolError, match="'ts_s' must be Unix seconds from 0 "):
        proto.parse_postmortem(obj)


def test_dropped_count_must_be_a_non_negative_integer():
    assert proto.parse_dropped({"type": "dropped", "count": 12}) == 12
    with pytest.raises(proto.ProtocolError, match="'count' must be an integer >= 0, got -1"):
        proto.parse_dropped({"type": "dropped", "count": -1})


# --- the column-wise fast path accepts exactly what record_from_json accepts -----------------

_value = st.one_of(st.none(), st.booleans(), st.integers(-5, 2**64),
                   st.integers(min_value=10**307, max_value=10**400),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3),
                   st.sampled_from(["prefill", "decode", "idle", "unknown", "torch"]))
_sample_obj = st.dictionaries(
    st.sampled_from(["ts", "device", "pid", "phase", "source", "host", "extra",
                     *SAMPLE_COUNTER_FIELDS[:4]]), _value, max_size=8)


def _slow(items):
    out = []
    for item in items:
        try:
            out.append(record_from_json(item))
        except (ValueError, TypeError, OverflowError):
            return None
    return out


@settings(max_examples=400, deadline=None)
@given(st.lists(_sample_obj, min_size=1, max_size=4))
def test_fast_path_agrees_with_the_trace_validator(items):
    fast = proto.fast_samples(items)
    if fast is not None:  # whatever the fast path accepts, the validator accepts identically
        assert fast == _slow(items)
        assert [type(s.ts_s) for s in fast] == [float] * len(fast)


def test_fast_path_takes_a_plain_batch():
    items = [{"ts": 1, "device": 2, "phase": "decode", "source": "torch", "pid": 5,
              "allocated_bytes": 10, "unknown_key": "kept out"}] * 3
    assert proto.fast_samples(items) == [Sample(1.0, 2, Phase.DECODE, "torch", 5,
                                                allocated_bytes=10)] * 3
    assert proto.fast_samples([*items, {"ts": 2, "event": "x"}]) is None  # events: slow path
