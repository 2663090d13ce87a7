"""``/api/v1/analysis`` runs no alert engine: its summaries (phases, fragmentation, KV peaks,
OOMs) come from the window's records, and every verdict field from the store (the verdict
rows the engine wrote, the alerts the agent stored, a post-mortem's cause). Where the store
holds no verdict, the document says so rather than answer for the engine."""

from __future__ import annotations

import pytest
from vramscope.agent.alerts.offline import analyze_records
from vramscope.agent.alerts.verdicts import Verdict
from vramscope.agent.config import parse_config
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Event, Phase, PostMortem, Sample
from vramscope.agent.store import Store, reader, window_verdicts
from vramscope.agent.store import verdicts as stored
from vramscope.dashboard import views
from vramscope.dashboard.app import create_app

GIB = 2**30
T0 = 1_700_000_040.0  # a two-minute boundary: the tier's 120 s buckets start here
END = T0 + 3 * 3600.0
OOM_TS = T0 + 7200.0
# the growth model's fields of a leak, and the KV pool's orphaned blocks (none in the scripted
# rows)
NO_GROWTH = {**dict.fromkeys(("rate_low_bytes_per_s", "rate_high_bytes_per_s", "time_to_oom_s",
                              "time_to_oom_low_s", "time_to_oom_high_s", "kv_pool")),
             "orphaned_blocks": 0}
PID = 7


def _records(store: Store) -> None:
    """Three flat hours of one process, a sample every 15 s (every fourth idle at 20 GiB, the
    others decoding 1 GiB above, 100-250 of 1,000 KV blocks in use), and an OOM event."""
    samples = []
    for k in range(720):
        idle = k % 4 == 0
        samples.append(Sample(T0 + 15 * k, 0, Phase.IDLE if idle else Phase.DECODE, "torch",
                              PID, allocated_bytes=20 * GIB + (0 if idle else GIB),
                              reserved_bytes=22 * GIB, device_total_bytes=80 * GIB,
                              kv_blocks_used=100 + 50 * (k % 4), kv_blocks_total=1000))
    store.write(samples, [Event(OOM_TS, "oom", 0, PID, Phase.DECODE, None)])


def _verdict(ts: float, leak: str, risk: str, cause: str | None,
             tto: float | None) -> Verdict:
    """A row of what the store says (scripted: not what an engine would say of the records)."""
    detected = None if leak != "leak" else T0 + 5400
    return Verdict(ts, 0, None, PID, leak, 1000.0 if detected else 0.0,
                   T0 + 1800 if detected else None, detected, 2400.0,
                   f"scripted: {leak}", risk, cause, ("alloc_retries",) if cause else (),
                   5 * GIB, tto, None if tto is None else tto / 2,
                   None if tto is None else tto * 2, 0.25, None)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The window is read a tier up (more raw samples than one request analyses)."""
    monkeypatch.setattr(reader, "RAW_SAMPLE_LIMIT", 100)
    s = Store.open(f"sqlite:///{tmp_path / 'a.db'}", host_name="h")
    _records(s)
    yield s
    s.close()


def _analysis(store: Store) -> dict:
    client = create_app(parse_config({}, None), store).test_client()
    r = client.get(f"/api/v1/analysis?device=0&start={T0}&end={END}")
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.get_json()


def _engine_on_the_buckets(store: Store) -> dict:
    """What the alert engine says when it is run over the window's tier (as the page did)."""
    window = reader.records(store, reader.Span(0, T0, END), SAMPLE_COUNTER_FIELDS, peaks=True,
                            max_buckets=views.REPORT_BUCKETS)
    return analyze_records(window.samples, window.events, None, device=0)


SUMMARIES = {  # the window's records as 90 two-minute buckets (a minimum and a maximum each)
    "fragmentation": {"max_inactive_split_ratio": 0.0, "max_external_fragmentation": None},
    "phases": {"prefill": {"samples": 0, "peak_allocated_bytes": 0},
               "decode": {"samples": 90, "peak_allocated_bytes": 21 * GIB},
               "idle": {"samples": 90, "peak_allocated_bytes": 20 * GIB},
               "setup": {"samples": 0, "peak_allocated_bytes": 0}},
    "kv": {"peak_blocks_used": 250, "blocks_total": 1000, "peak_usage_ratio": 0.25,
           "pools": 1},
}


def test_the_document_gives_the_stored_answer_not_an_engine_run_on_the_buckets(store):
    stored.write(store, [_verdict(T0 + 3600, "insufficient_data", "ok", None, None),
                         _verdict(T0 + 5400, "leak", "warning", "fragmentation", 1800.0),
                         _verdict(T0 + 7100, "leak", "critical", "fragmentation", 100.0),
                         _verdict(T0 + 10_500, "leak", "ok", None, None)])
    kv = store.open_alert("kv_exhaustion", "warning", T0 + 5000, device=0, host="h")
    store.resolve_alert(kv, T0 + 5100)
    store.open_alert("memory_leak", "warning", T0 + 5460, device=0, host="h")
    doc = _analysis(store)
    engine = _engine_on_the_buckets(store)
    assert (doc["format"], doc["verdicts_from"], doc["alerts_from"]) == (
        "vramscope.analysis/1", "store", "agent")
    assert (doc["tier"], doc["bucket_s"]) == ("raw samples grouped in SQL, 120 s buckets", 120.0)
    d = doc["devices"]["0"]
    assert d["leak"] == {"detected": True, "state": "leak", "slope_bytes_per_s": 1000.0,
                         "first_detected_ts": T0 + 5400, "span_s": 2400.0,
                         "evidence": "scripted: leak", "pid": PID, "makeup": None,
                         "windows": None, "estimated_floor": False, **NO_GROWTH}
    assert d["oom"] == {"occurred": True, "first_oom_ts": OOM_TS,
                        "first_warning_ts": T0 + 5000,  # the kv_exhaustion alert: sooner
                        "max_risk": "critical", "min_time_to_oom_s": 100.0,
                        "cause": "fragmentation"}  # stored with the warning at the OOM
    assert [(p["pid"], p["ts"], p["leak"]["state"], p["risk"]["level"])
            for p in d["processes"]] == [(PID, T0 + 10_500, "leak", "ok")]
    assert doc["alerts"] == [
        {"rule": "kv_exhaustion", "severity": "warning", "device": 0, "fired_ts": T0 + 5000,
         "resolved_ts": T0 + 5100},
        {"rule": "memory_leak", "severity": "warning", "device": 0, "fired_ts": T0 + 5460,
         "resolved_ts": None}]
    assert {k: d[k] for k in SUMMARIES} == SUMMARIES
    # the engine over the same buckets says otherwise on every verdict the page shows
    e = engine["devices"]["0"]
    assert (e["leak"]["state"], e["leak"]["windows"] is None) == ("no_leak", False)
    assert {k: e["oom"][k] for k in ("first_warning_ts", "max_risk", "cause")} == {
        "first_warning_ts": None, "max_risk": "ok", "cause": "unknown"}
    assert [a["rule"] for a in engine["alerts"]] == ["oom"]
    assert {k: e[k] for k in SUMMARIES} == SUMMARIES  # the summaries are the same


def test_without_stored_verdicts_the_document_says_so(store):
    doc = _analysis(store)
    d = doc["devices"]["0"]
    assert (doc["verdicts_from"], doc["alerts_from"], doc["alerts"]) == (
        "store", "none_stored", [])
    assert d["leak"] == {"detected": False, "state": "insufficient_data",
                         "slope_bytes_per_s": 0.0, "first_detected_ts": None, "span_s": 0.0,
                         "evidence": window_verdicts.NO_VERDICTS, "pid": None, "makeup": None,
                         "windows": None, "estimated_floor": False, **NO_GROWTH}
    assert d["oom"] == {"occurred": True, "first_oom_ts": OOM_TS, "first_warning_ts": None,
                        "max_risk": None, "min_time_to_oom_s": None, "cause": None}
    assert d["processes"] == []
    assert {k: d[k] for k in SUMMARIES} == SUMMARIES
    # what an engine run would have invented in its place
    e = _engine_on_the_buckets(store)["devices"]["0"]
    assert e["leak"]["state"] == "no_leak" and e["oom"]["max_risk"] == "ok"


def test_an_empty_window_is_a_whole_document_without_answers(store):
    client = create_app(parse_config({}, None), store).test_client()
    doc = client.get(f"/api/v1/analysis?device=0&start={END + 60}&end={END + 120}").get_json()
    d = doc["devices"]["0"]
    assert (d["leak"]["state"], d["leak"]["evidence"]) == ("insufficient_data",
                                                            window_verdicts.NO_VERDICTS)
    assert (d["oom"]["occurred"], d["oom"]["max_risk"]) == (False, None)
    assert d["phases"]["decode"] == {"samples": 0, "peak_allocated_bytes": 0}
    assert d["kv"] == {"peak_blocks_used": None, "blocks_total": None,
                       "peak_usage_ratio": None, "pools": 0}


def test_an_oom_with_a_post_mortem_has_the_post_mortem_pages_cause(store):
    """The post-mortem stored without a cause: the document's is the one its page gives (the
    post-mortem's own facts), before the cause a stored warning named."""
    stored.write(store, [_verdict(T0 + 7100, "no_leak", "warning", "load", 600.0)])
    pm_id = store.write_postmortem(PostMortem(
        OOM_TS + 1, 0, PID, Phase.DECODE, 2 * GIB, GIB, 80 * GIB, 60 * GIB, 66 * GIB,
        GIB // 2, 0.92, message="CUDA out of memory. Tried to allocate 2.00 GiB"))
    page = create_app(parse_config({}, None), store).test_client().get(
        f"/api/v1/postmortems/{pm_id}").get_json()
    oom = _analysis(store)["devices"]["0"]["oom"]
    assert (oom["first_oom_ts"], oom["cause"]) == (OOM_TS, page["cause"])
    assert page["cause"] == "fragmentation"


def test_without_stored_alerts_the_risk_page_lists_the_stored_rises_to_a_warning(store):
    """A store imported without alerts: the OOM-risk page lists where the stored level rose. A
    process's first judged row (no level before the model's first point, then ``ok``) is no
    warning; a fall and a second rise are."""
    stored.write(store, [_verdict(T0 + 600, "insufficient_data", "", None, None),
                         _verdict(T0 + 1200, "insufficient_data", "ok", None, None),
                         _verdict(T0 + 3600, "no_leak", "warning", "load", 600.0),
                         _verdict(T0 + 3700, "no_leak", "ok", None, None),
                         _verdict(T0 + 4000, "no_leak", "critical", "load", 60.0)])
    client = create_app(parse_config({}, None), store).test_client()
    r = client.get(f"/api/v1/figures/risk?device=0&start={T0}&end={END}")
    assert r.status_code == 200, r.get_data(as_text=True)
    assert [(w["ts"], w["severity"], w["label"]) for w in r.get_json()["warnings"]] == [
        (T0 + 3600, "warning", f"risk verdict [pid {PID}]: warning (load)"),
        (T0 + 4000, "critical", f"risk verdict [pid {PID}]: critical (load)")]
