"""``vramscope analyze`` end to end: trace files and a real SQLite store, text and --json."""

import json

import pytest
from vramscope.agent.cli import main
from vramscope.agent.records import Event, Phase, PostMortem, Sample
from vramscope.agent.trace import write_trace

G = 2**30


def recording():
    """A minute of decode with one prefill, a KV pool, then an OOM in prefill."""
    samples = []
    for t in range(60):
        phase = Phase.PREFILL if t in (20, 21) else Phase.DECODE
        alloc = (60 if phase is Phase.PREFILL else 50) * G
        samples.append(Sample(1000.0 + t, 0, phase, "sim", allocated_bytes=alloc,
                              reserved_bytes=62 * G, inactive_split_bytes=G,
                              device_total_bytes=80 * G, kv_blocks_used=100 + t,
                              kv_blocks_total=1000))
    samples.append(Sample(1060.0, 0, Phase.PREFILL, "sim", allocated_bytes=79 * G,
                          reserved_bytes=79 * G, device_total_bytes=80 * G))
    events = [Event(1060.5, "oom", 0, data={"message": "CUDA out of memory"})]
    return samples, events


# the growth model's figures: no rate yet, so no interval and no time to OOM; no orphaned KV
# blocks
NO_GROWTH = {**dict.fromkeys(("rate_low_bytes_per_s", "rate_high_bytes_per_s", "time_to_oom_s",
                              "time_to_oom_low_s", "time_to_oom_high_s", "kv_pool")),
             "orphaned_blocks": 0}
EXPECTED_DEVICE = {
    "leak": {"detected": False, "state": "insufficient_data", "slope_bytes_per_s": 0.0,
             "first_detected_ts": None, "span_s": 0.0,
             "evidence": "not enough data yet: warming up (the first 5 min of a process are "
                         "not its floor), then 15 min of idle floor", "makeup": None,
             "windows": None,  # one prefill in 61 s: no cycle, windows chosen after 120 s
             "estimated_floor": False, **NO_GROWTH},
    # at 1060 a prefill to 79 GiB leaves 1.25 % of 80 GiB: critical; first warned then
    "oom": {"occurred": True, "first_oom_ts": 1060.5, "first_warning_ts": 1060.0,
            "max_risk": "critical", "min_time_to_oom_s": None, "cause": "prefill_spike"},
    "fragmentation": {"max_inactive_split_ratio": 1 / 62, "max_external_fragmentation": None},
    "phases": {"prefill": {"samples": 3, "peak_allocated_bytes": 79 * G},
               "decode": {"samples": 58, "peak_allocated_bytes": 50 * G},
               "idle": {"samples": 0, "peak_allocated_bytes": 0},
               "setup": {"samples": 0, "peak_allocated_bytes": 0}},
    "kv": {"peak_blocks_used": 159, "blocks_total": 1000, "peak_usage_ratio": 0.159,
           "pools": 1},
    # the engine's verdict as it stores it (records without a pid: the device as a whole),
    # its newest row: the OOM at 1060.5 ended the risk episode (the prefill at 1060 that left
    # 1 GiB was critical; an OOM ends its process's risk: ok, no forecast)
    "processes": [{
        "format": "vramscope.verdict/1", "ts": 1060.5, "device": 0, "host": None, "pid": None,
        "rank": None, "ended": False,
        "leak": {"state": "insufficient_data", "slope_bytes_per_s": 0.0,
                 "slope_bytes_per_h": 0.0, "start_ts": None, "first_detected_ts": None,
                 "span_s": 0.0,
                 "evidence": "not enough data yet: warming up (the first 5 min of a process "
                             "are not its floor), then 15 min of idle floor",
                 "trend_line": None, "windows": None,  # not chosen yet: as the leak's
                 "estimated_floor": False, **NO_GROWTH},
        "risk": {"level": "ok", "cause": None, "at_risk_from_pid": None, "reasons": [],
                 "headroom_bytes": G, "time_to_oom_s": None, "time_to_oom_low_s": None,
                 "time_to_oom_high_s": None},
        "kv": {"usage_ratio": 0.159, "exhaustion_s": 841.0}}],
}


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "run.jsonl"
    with open(path, "w") as fh:
        write_trace(fh, *recording())
    return str(path)


def test_json_is_exactly_the_analysis_document(trace_file, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", trace_file, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"format": "vramscope.analysis/1", "devices": {"0": EXPECTED_DEVICE},
                   "alerts": [
                       # the OOM ends the risk episode: its alerts resolve at it
                       {"rule": "oom_risk", "severity": "warning", "device": 0,
                        "fired_ts": 1060.0, "resolved_ts": 1060.5},
                       {"rule": "oom_risk_critical", "severity": "critical", "device": 0,
                        "fired_ts": 1060.0, "resolved_ts": 1060.5},
                       {"rule": "oom", "severity": "critical", "device": 0,
                        "fired_ts": 1060.5, "resolved_ts": None}]}


def test_readable_report(trace_file, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", trace_file]) == 0
    out = capsys.readouterr().out
    assert "device 0" in out
    # ISO 8601 UTC, not raw Unix seconds
    assert ("OOM at 1970-01-01T00:17:40.500Z (warned 0.5 s before); likely cause: prefill_spike"
            in out)
    assert "first warning 1970-01-01T00:17:40.000Z" in out
    assert "fired 1970-01-01T00:17:40.500Z, still firing" in out
    assert "max external n/a" in out and "(external: the share" not in out  # no snapshot
    assert "    - enable chunked prefill (bound the tokens prefilled per step)" in out
    assert "KV pool: peak 159 of 1000 blocks (15.9%)" in out
    assert "  leak: not enough data yet: warming up (the first 5 min" in out  # not "none"
    assert "alerts: 3" in out


def test_the_database_gives_the_same_document_and_uses_postmortems(store, sqlite_url, capsys,
                                                                   monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VRAMSCOPE_AGENT_HOST_NAME", "testhost")  # the store fixture's host
    samples, events = recording()
    store.write(samples, events, origin="test")
    # the post-mortem says the allocation failed with 4 GiB cached free but no block that large
    store.write_postmortem(PostMortem(1060.5, 0, 7, Phase.PREFILL, 2 * G, 0, 80 * G, 75 * G,
                                      79 * G, G // 2, 0.875, ("r1",)))
    store.close()
    assert main(["analyze", "--db", sqlite_url, "--json", "--device", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["devices"]["0"]["oom"]["cause"] == "fragmentation"
    for key in ("leak", "fragmentation", "phases", "kv"):
        assert doc["devices"]["0"][key] == EXPECTED_DEVICE[key]


@pytest.mark.parametrize("argv, message", [
    (["analyze"], "give trace FILEs or --db URL"),
    (["analyze", "x.jsonl", "--db", "sqlite:///x.db"], "give trace FILEs or --db URL"),
])
def test_usage_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_bad_trace_names_the_file_and_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ts": 1, "allocated_bytes": 5}\n{"ts": 2, "allocated_bytes": -1}\n')
    assert main(["analyze", str(bad)]) == 1
    assert f"{bad}:2: 'allocated_bytes' must be >= 0" in capsys.readouterr().err


def test_a_bad_alert_rule_in_the_config_is_reported(trace_file, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "v.toml"
    cfg.write_text('[[alerts.rules]]\nname = "x"\nmetric = "reserved_bytes"\nop = "=>"\n'
                   'threshold = 1\n')
    assert main(["analyze", trace_file, "--config", str(cfg)]) == 1
    assert "alert rule 'x': op = '=>' is not one of" in capsys.readouterr().err


def test_external_fragmentation_is_explained_where_it_is_printed(tmp_path, capsys):
    """96.9 % looked alarming on healthy devices: the report says what the share means."""
    path = tmp_path / "frag.jsonl"
    samples = [Sample(1000.0 + t, 0, Phase.DECODE, "sim", allocated_bytes=10 * G,
                      reserved_bytes=14 * G, largest_free_block_bytes=G // 8,
                      device_total_bytes=80 * G) for t in range(5)]
    with open(path, "w") as fh:
        write_trace(fh, samples, [])
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert "max external 96.9%" in out  # 1 - 0.125 / 4
    assert ("    (external: the share of cached free memory outside the largest free block; a "
            "risk only when the largest request fits neither that block nor new memory, which "
            "the OOM-risk line above includes)") in out


def test_the_readable_report_lists_every_postmortem(store, sqlite_url, capsys, monkeypatch,
                                                    tmp_path):
    """The document keeps each device's first OOM; the text lists every post-mortem (GPU 2 of
    the demo had two and the report showed one)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VRAMSCOPE_AGENT_HOST_NAME", "testhost")
    samples, events = recording()
    store.write(samples, events, origin="test")
    for ts in (1030.0, 1060.5):
        store.write_postmortem(PostMortem(ts, 0, 7, Phase.PREFILL, 2 * G, 0, 80 * G, 75 * G,
                                          79 * G, G // 2, 0.875, ("r1",)))
    store.close()
    assert main(["analyze", "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert out.endswith("post-mortems: 2\n"
                        "  device 0 at 1970-01-01T00:17:10.000Z: likely cause fragmentation, "
                        "failed allocation 2048.0 MiB\n"
                        "  device 0 at 1970-01-01T00:17:40.500Z: likely cause fragmentation, "
                        "failed allocation 2048.0 MiB\n")
