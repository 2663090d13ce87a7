"""The figures of a growth-to-OOM run recorded THROUGH A RUNNING AGENT (tests/gpu/
record_growth_oom.sh; docs/gpu-runs/2026-12-06/live/, docs/gpu-verification.md section 20), read
from what the live agent stored: its verdict rows, its alert rows, the OOM post-mortem. Nothing
is replayed: these are the answers the agent gave as the servers ran.

The truth comes from the servers' own files in the run's tar: the grower's ``cb-grow.json``
(onset = its first kept tensor, the OOM's time, tensors kept), ``meta.json`` (the bytes kept
each time), ``timeline.txt`` (pids, starts and exits).

    python -m tests.gpu.live_growth_figures docs/gpu-runs/2026-12-06/live/main [...]

writes each run's ``figures.json``, which tests/support/gpu_docs.py renders into section 20;
tests/agent/test_gpu_live_growth.py checks that the file is what the run's store gives."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from vramscope.agent.alerts.verdicts import Verdict
from vramscope.agent.analysis.diagnosis import complete_postmortem
from vramscope.agent.store import Store
from vramscope.agent.store import verdicts as stored_verdicts

MB = 1e6


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    f = tar.extractfile(f"./{name}")
    if f is None:
        raise ValueError(f"{name} is not a file in the run's tar")
    return f.read()


def run_files(run: Path) -> dict[str, Any]:
    """meta.json, cb-grow.json and the timeline (pid, start, exit of each server)."""
    with tarfile.open(run / "growth_oom_files.tar.gz") as tar:
        meta = json.loads(_member(tar, "meta.json"))
        grow = json.loads(_member(tar, "cb-grow.json"))
        lines = _member(tar, "timeline.txt").decode().splitlines()
    servers: dict[str, dict[str, float | int]] = {}
    for line in lines:
        ts, name, what, value = line.split()
        if name == "agent":
            continue
        key = "pid" if what == "pid" else "exit_rc"
        servers.setdefault(name, {})[key] = int(value)
        servers[name]["start_ts" if what == "pid" else "exit_ts"] = float(ts)
    return {"meta": meta, "grow": grow, "servers": servers}


def _rounded(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(x, nd)


def _at(v: Verdict, onset: float, oom: float) -> dict[str, Any]:
    return {"after_onset_s": round(v.ts_s - onset, 1), "before_oom_s": round(oom - v.ts_s, 1)}


def figures(run: Path) -> dict[str, Any]:
    """The run's figures, times in seconds (after the grower's onset, before its OOM)."""
    files = run_files(run)
    meta, grow, servers = files["meta"], files["grow"], files["servers"]
    onset = grow["first_kept_ts"]
    grower = grow["pid"]
    healthy = [servers[n]["pid"] for n in ("cb-healthy-1", "cb-healthy-2")]
    # the truth: tensors of keep_bytes kept from the first to the last (one every ~1.06 s)
    true_rate = (grow["kept_tensors"] - 1) * meta["keep_bytes"] / (
        grow["last_kept_ts"] - grow["first_kept_ts"])
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "run.db"
        with gzip.open(run / "growth_oom.db.gz") as src, open(db, "wb") as dst:
            shutil.copyfileobj(src, dst)
        store = Store.open(f"sqlite:///{db}")  # a copy: brought to the head schema
        try:
            rows = stored_verdicts.history(store, 0, None, 0.0, float("inf"))
            alerts = store.alerts(device=0)
            pms = [complete_postmortem(pm) for _, pm in store.postmortems(0)]
            oom_events = [e for e in store.iter_events(0, None, None) if e.name == "oom"]
        finally:
            store.engine.dispose()
    # the OOM as the agent stored it (its post-mortem's time; the server's own is ~0.02 s later)
    oom = min(e.ts_s for e in oom_events)
    mine = [v for v in rows if v.pid == grower]
    before = [v for v in mine if v.ts_s < oom]
    after = [v for v in mine if v.ts_s >= oom]
    leak = next(v for v in mine if v.leak_state == "leak")
    out: dict[str, Any] = {
        "grower": grower, "healthy": healthy,
        "onset_after_t0_s": round(onset - grow["t0"], 1),
        "oom_after_onset_s": round(oom - onset, 1),
        "server_oom_after_agent_s": round(grow["oom"]["ts"] - oom, 2),
        "true_rate_mb_s": round(true_rate / MB, 1),
        "first_leak": {
            **_at(leak, onset, oom),
            "rate_mb_s": [round(x / MB, 1) for x in (
                leak.leak_slope_bytes_per_s, leak.leak_rate_low_bytes_per_s,
                leak.leak_rate_high_bytes_per_s)],
            "time_to_oom_s": [_rounded(x) for x in (
                leak.leak_time_to_oom_s, leak.leak_time_to_oom_low_s,
                leak.leak_time_to_oom_high_s)],
        },
        "risk_before_oom": [  # every change of the grower's level, with its forecast
            {**_at(v, onset, oom), "level": v.risk_level, "cause": v.risk_cause,
             "time_to_oom_s": [_rounded(x) for x in (
                 v.time_to_oom_s, v.time_to_oom_low_s, v.time_to_oom_high_s)],
             "leak_time_to_oom_s": [_rounded(x) for x in (
                 v.leak_time_to_oom_s, v.leak_time_to_oom_low_s, v.leak_time_to_oom_high_s)]}
            for i, v in enumerate(before)
            if v.risk_level != (before[i - 1].risk_level if i else "ok")],
        "after_oom": [  # the dead grower's rows: (s after the OOM, leak, level, cause, ended)
            (round(v.ts_s - oom, 1), v.leak_state, v.risk_level, v.risk_cause, v.ended)
            for v in after],
        "healthy_leak_states": sorted({v.leak_state for v in rows if v.pid in healthy}),
        "healthy_risk": [  # every row of a healthy pid whose risk was not ok (s before the OOM)
            (v.pid, round(oom - v.ts_s, 1), v.risk_level, v.risk_cause, v.risk_reasons,
             round((v.headroom_bytes or 0) / 2**30, 1))
            for v in rows if v.pid in healthy and v.risk_level not in ("ok", "")],
        # the healthy pids' stored "at risk from pid N's growth" (pid, N), once each
        "healthy_at_risk_from": sorted({
            (v.pid, v.risk_at_risk_from_pid) for v in rows
            if v.pid in healthy and v.risk_at_risk_from_pid is not None}),
        "ended": sorted({  # each server's first `ended` row: (pid, seconds after it exited)
            v.pid: round(v.ts_s - next(s["exit_ts"] for s in servers.values()
                                       if s["pid"] == v.pid), 1)
            for v in reversed(rows) if v.ended and v.pid is not None}.items()),
        "alerts": [  # the agent's alert rows: fired and resolved, seconds before the OOM
            (a["rule"], round(oom - a["fired_ts_s"], 1),
             None if a["resolved_ts_s"] is None else round(oom - a["resolved_ts_s"], 1),
             a["message"])
            for a in sorted(alerts, key=lambda a: (a["fired_ts_s"], a["id"]))],
        "postmortem_causes": [pm.cause for pm in pms],
    }
    with open(run / "analyze.json") as fh:  # `vramscope analyze --db --json` on the GPU machine
        dev = json.load(fh)["devices"]["0"]
    out["analyze_oom_cause"] = dev["oom"]["cause"]
    # its device-level leak answer (pid, state) and the grower's process line
    out["analyze_leak"] = [dev["leak"].get("pid"), dev["leak"]["state"]]
    row = next(p for p in dev["processes"] if p["pid"] == grower)
    out["analyze_grower"] = [row["leak"]["state"], row["risk"]["level"], row["ended"]]
    out["card"] = f"{grow['device']}, torch {grow['torch']}, transformers {grow['transformers']}"
    return json.loads(json.dumps(out))  # tuples as lists: what figures.json holds


def write(run: Path) -> dict[str, Any]:
    """The run's figures into RUN/figures.json (what docs/gpu-verification.md renders)."""
    doc = figures(run)
    (run / "figures.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        write(Path(arg))
