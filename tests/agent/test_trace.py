"""Trace format v1: parsing, strictness (one test per kind of malformed line), round trips."""

from __future__ import annotations

import io
import json

import pytest
from vramscope.agent.cli import main
from vramscope.agent.errors import TraceError
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.trace import parse_lines, parse_record, write_trace

GOOD = '{"ts": 10.5, "device": 1, "phase": "prefill", "source": "torch", "pid": 7, ' \
       '"allocated_bytes": 1024, "reserved_bytes": 2048, "num_alloc_retries": 0}'


def test_sample_line_parses_every_field():
    s = parse_record(GOOD)
    assert s == Sample(10.5, 1, Phase.PREFILL, "torch", 7, allocated_bytes=1024,
                       reserved_bytes=2048, num_alloc_retries=0)


def test_defaults_and_unknown_keys_ignored():
    s = parse_record('{"ts": 3, "mystery": {"a": 1}, "kv_blocks_used": null}')
    assert s == Sample(3.0, 0, Phase.UNKNOWN)


def test_event_line_keeps_extra_keys_in_data():
    e = parse_record('{"ts": 4, "event": "oom", "device": 2, "message": "CUDA out of memory", '
                     '"request_id": "r9", "phase": "decode"}')
    assert e == Event(4.0, "oom", 2, None, Phase.DECODE, "r9", {"message": "CUDA out of memory"})


MALFORMED = [
    ("not json", "{ts: 1}", "not valid JSON"),
    ("not an object", "[1, 2]", "expected a JSON object, got list"),
    ("missing ts", '{"device": 0}', "missing required key 'ts'"),
    ("ts wrong type", '{"ts": "noon"}', "'ts' must be a number, got 'noon'"),
    ("NaN", '{"ts": NaN}', "NaN is not allowed"),
    ("Infinity bytes", '{"ts": 1, "reserved_bytes": Infinity}', "Infinity is not allowed"),
    ("negative bytes", '{"ts": 1, "allocated_bytes": -5}',
     "'allocated_bytes' must be >= 0, got -5"),
    ("non-integer bytes", '{"ts": 1, "allocated_bytes": 1.5}',
     "'allocated_bytes' must be a non-negative integer, got 1.5"),
    ("bool bytes", '{"ts": 1, "allocated_bytes": true}',
     "'allocated_bytes' must be a non-negative integer, got True"),
    ("string bytes", '{"ts": 1, "reserved_bytes": "12"}',
     "'reserved_bytes' must be a non-negative integer, got '12'"),
    ("huge bytes", '{"ts": 1, "allocated_bytes": 99999999999999999999}',
     "'allocated_bytes' is too large"),
    ("unknown phase", '{"ts": 1, "phase": "warmup"}', "unknown phase 'warmup'"),
    ("bad device", '{"ts": 1, "device": "gpu0"}', "'device' must be an integer, got 'gpu0'"),
    ("empty event name", '{"ts": 1, "event": ""}', "'event' must be a non-empty string"),
]


@pytest.mark.parametrize("kind,line,problem", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_strict_parse_names_file_line_and_problem(kind, line, problem):
    text = [GOOD, GOOD, line, GOOD]
    with pytest.raises(TraceError) as info:
        parse_lines(text, "run.jsonl")
    assert info.value.line == 3
    assert str(info.value).startswith("run.jsonl:3: ")
    assert problem in str(info.value)


@pytest.mark.parametrize("kind,line,problem", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_strict_import_writes_nothing(kind, line, problem, tmp_path, capsys):
    from vramscope.agent.store import Store

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    good = tmp_path / "good.jsonl"
    good.write_text(GOOD + "\n")
    assert main(["import", str(good), "--db", url]) == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([GOOD, "", line, GOOD]) + "\n")  # blank line still counts
    assert main(["import", str(bad), "--db", url]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:3: " in err and problem in err and "Traceback" not in err
    with Store.open(url) as store:
        assert store.count("samples") == 1  # only the earlier good import


def test_skip_invalid_loads_good_lines_and_counts(tmp_path, capsys):
    from vramscope.agent.store import Store

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    f = tmp_path / "mixed.jsonl"
    f.write_text("\n".join([GOOD, "{oops", GOOD, '{"ts": -1, "reserved_bytes": -1}']) + "\n")
    assert main(["import", str(f), "--db", url, "--skip-invalid"]) == 0
    out = capsys.readouterr()
    assert "imported 2 samples and 0 events, skipped 2 invalid lines" in out.out
    assert f"{f}:2: not valid JSON" in out.err
    with Store.open(url) as store:
        assert store.count("samples") == 2


def test_missing_file_is_a_clear_error(tmp_path, capsys):
    assert main(["import", str(tmp_path / "nope.jsonl"), "--db",
                 f"sqlite:///{tmp_path / 'x.db'}"]) == 1
    assert "nope.jsonl:0: cannot read: No such file or directory" in capsys.readouterr().err


def test_write_trace_merges_in_time_order():
    out = io.StringIO()
    n = write_trace(out, [Sample(2.0, allocated_bytes=5)], [Event(1.0, "phase", phase=Phase.IDLE)])
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert n == 2
    assert lines == [{"ts": 1.0, "event": "phase", "device": 0, "phase": "idle"},
                     {"ts": 2.0, "device": 0, "phase": "unknown", "allocated_bytes": 5}]


def _trace_lines() -> list[str]:
    lines = []
    for i in range(50):
        lines.append(json.dumps({
            "ts": 1_700_000_000 + i * 0.1, "device": i % 2, "source": "torch", "pid": 11,
            "phase": ["prefill", "decode", "idle"][i % 3], "allocated_bytes": 10**9 + i,
            "reserved_bytes": 2 * 10**9, "inactive_split_bytes": i * 512,
            "num_alloc_retries": i // 10, "kv_blocks_used": i, "kv_blocks_total": 100}))
    lines.append(json.dumps({"ts": 1_700_000_000.05, "event": "request_start", "device": 0,
                             "request_id": "r1", "prompt_tokens": 512}))
    lines.append(json.dumps({"ts": 1_700_000_003, "event": "oom", "device": 1,
                             "message": "CUDA out of memory. Tried to allocate 2.00 GiB"}))
    return lines


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("pg", marks=pytest.mark.postgres)])
def test_import_then_export_gives_back_the_same_records(backend, tmp_path, request, capsys):
    url = (f"sqlite:///{tmp_path / 'rt.db'}" if backend == "sqlite"
           else request.getfixturevalue("postgres_url"))
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(_trace_lines()) + "\n")
    assert main(["import", str(src), "--db", url]) == 0
    dst = tmp_path / "out.jsonl"
    assert main(["export", "--db", url, "-o", str(dst)]) == 0
    original = parse_lines(src.read_text().splitlines())
    again = parse_lines(dst.read_text().splitlines())
    assert sorted(again.samples) == sorted(original.samples)
    by_time = lambda e: e.ts_s  # noqa: E731
    assert sorted(again.events, key=by_time) == sorted(original.events, key=by_time)


def test_export_filters_by_device_and_time(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(_trace_lines()) + "\n")
    url = f"sqlite:///{tmp_path / 'f.db'}"
    assert main(["import", str(src), "--db", url]) == 0
    dst = tmp_path / "out.jsonl"
    assert main(["export", "--db", url, "--device", "1", "--since", "1700000001",
                 "--until", "1700000002", "-o", str(dst)]) == 0
    got = parse_lines(dst.read_text().splitlines())
    assert [round(s.ts_s - 1_700_000_000, 1) for s in got.samples] == [1.1, 1.3, 1.5, 1.7, 1.9]
    assert all(s.device == 1 for s in got.samples) and got.events == []


def test_export_streams_the_store_in_the_order_write_trace_gives(tmp_path, monkeypatch):
    """`vramscope export` merges the store's two cursors as it reads them: each line is
    written before the next sample is read (the old export built the whole file's lines
    first), and the file is byte for byte what write_trace makes of the same records."""
    import vramscope.agent.trace as trace_mod
    from vramscope.agent.store import Store

    from tools.history_generator import History, generate

    url = f"sqlite:///{tmp_path / 'x.db'}"
    with Store.open(url) as store:  # 2 devices at 10 Hz for 0.01 day, with request events
        generate(store, History(devices=2, hz=10, days=0.01, rollups=False))
        samples, events = list(store.iter_samples(None)), store.events(None)
    assert len(samples) == 17_280 and len(events) > 100
    read, written, ahead = [0], [0], [0]
    real_iter, real_to_json = Store.iter_samples, trace_mod.sample_to_json

    def iter_samples(self, *args, **kwargs):
        for s in real_iter(self, *args, **kwargs):
            read[0] += 1
            yield s

    def sample_to_json(s):
        written[0] += 1
        ahead[0] = max(ahead[0], read[0] - written[0])
        return real_to_json(s)

    monkeypatch.setattr(Store, "iter_samples", iter_samples)
    monkeypatch.setattr(trace_mod, "sample_to_json", sample_to_json)
    dst = tmp_path / "out.jsonl"
    assert main(["export", "--db", url, "-o", str(dst)]) == 0
    assert written[0] == len(samples) and ahead[0] <= 1  # the merge's one sample in hand
    monkeypatch.setattr(trace_mod, "sample_to_json", real_to_json)
    expected = io.StringIO()
    assert write_trace(expected, samples, events) == len(samples) + len(events)
    assert dst.read_text() == expected.getvalue()
