"""Every surface's answer on the H200 recording of two servers through a running agent
(``tests/gpu/record_agent_pair.sh``): the live agent's stored verdicts, ``analyze FILE`` of the
store's export, ``analyze --db``, ``/api/v1/analysis``, the Leaks and OOM-risk views at 15 min
and the whole run, and ``/metrics``. Writes the comparison as JSON (rendered into
docs/gpu-verification.md by tests/support/gpu_docs.py):

    python tests/gpu/one_answer_check.py docs/gpu-runs/2026-12-04b/gpu_agent_pair.db.gz \\
        docs/gpu-runs/2026-12-04b/one_answer.json

Runs on any machine (no GPU): the recording is committed; ``tests/agent/test_one_answer.py``
checks the committed JSON against a fresh run of this script.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from vramscope.agent.cli import main as cli
from vramscope.agent.config import parse_config
from vramscope.agent.store import Store
from vramscope.agent.store import verdicts as stored
from vramscope.dashboard.app import create_app

# the agent's config on the GPU machine (record_agent_pair.sh): warm-up and span shortened so
# that a verdict fits the lease
AGENT_CONFIG = "[alerts]\nleak_warmup_s = 300\nleak_min_span_s = 600\n"


def _answer(v: dict[str, Any]) -> list[Any]:
    return [v["pid"], v["leak"]["state"], v["leak"]["slope_bytes_per_s"],
            v["leak"]["first_detected_ts"], v["risk"]["level"]]


def _by_pid(answers: Any) -> list[list[Any]]:
    """Answers in pid order; a device's verdict from before any process was known (pid None)
    first."""
    return sorted(answers, key=lambda a: (a[0] is not None, a[0] or 0, repr(a[1:])))


def _cli_json(argv: list[str]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(argv) == 0, argv
    return json.loads(out.getvalue())


def check(db_gz: Path, agent_config: str = AGENT_CONFIG) -> dict[str, Any]:
    """Every surface's answer on the recording ``db_gz``; ``agent_config``: the agent's
    settings on the GPU machine (``""``: the defaults, tests/gpu/record_cb_pair.sh's)."""
    work = Path(tempfile.mkdtemp(prefix="vs-gpu-one-"))
    try:
        db = work / "agent.db"
        with gzip.open(db_gz) as src, open(db, "wb") as dst:
            shutil.copyfileobj(src, dst)
        config = work / "agent.toml"
        config.write_text(agent_config)
        url = f"sqlite:///{db}"
        with Store.open(url) as store:
            last = store.time_range(0)
            assert last is not None
            end = last[1]
            live = _by_pid(_answer(v.to_json()) for v in stored.current(
                stored.latest(store, 0, None, end)))
            names = {p["pid"]: p["name"] for p in store.processes()}
            history = [[v.pid, round(v.ts_s - last[0], 1), v.leak_state, v.leak_slope_bytes_per_s,
                        v.risk_level] for v in stored.history(store, 0, None, 0.0, end)]
            alerts = [[a["rule"], a["severity"], round(a["fired_ts_s"] - last[0], 1),
                       a["resolved_ts_s"] and round(a["resolved_ts_s"] - last[0], 1),
                       a["message"]] for a in reversed(store.alerts())]
        trace = work / "export.jsonl"
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli(["export", "--db", url, "--output", str(trace)]) == 0
        on_file = _cli_json(["analyze", str(trace), "--json", "--config", str(config)])
        on_db = _cli_json(["analyze", "--db", url, "--json", "--config", str(config)])
        surfaces: dict[str, list[Any]] = {
            "analyze FILE (the store's export)": _by_pid(
                _answer(v) for v in on_file["devices"]["0"]["processes"]),
            "analyze --db": _by_pid(_answer(v) for v in on_db["devices"]["0"]["processes"]
                                   if not v["ended"]),
        }
        with Store.open(url) as store:
            client = create_app(parse_config({}, None), store).test_client()
            for label, start in (("15 min", end - 900.0), ("whole run", last[0])):
                q = f"device=0&start={start}&end={end}"
                for route in ("figures/leaks", "figures/risk"):
                    doc = client.get(f"/api/v1/{route}?{q}").get_json()
                    surfaces[f"{route}, {label}"] = _by_pid(
                        _answer(v) for v in doc["processes"] if not v["ended"])
                doc = client.get(f"/api/v1/analysis?{q}").get_json()
                surfaces[f"analysis, {label}"] = _by_pid(
                    _answer(v) for v in doc["devices"]["0"]["processes"] if not v["ended"])
            metrics = client.get("/metrics").get_data(as_text=True)
        leak_lines = sorted(line for line in metrics.splitlines()
                            if line.startswith("vramscope_process_leak_state{"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"recording": db_gz.name, "first_ts": last[0], "span_s": end - last[0],
            "verdict_rows": len(history),
            "processes": {str(pid): name for pid, name in sorted(names.items())},
            "live": live, "surfaces": surfaces,
            "same_everywhere": all(v == live for v in surfaces.values()),
            "metrics_leak_state": leak_lines,
            # every stored verdict (pid, seconds after the first sample, leak state, slope
            # bytes/s, risk level) and every alert (rule, severity, fired and resolved seconds
            # after the first sample, message), as the agent wrote them
            "history": history, "alerts": alerts}


if __name__ == "__main__":
    # a third argument "defaults": the recording was made with the agent's default settings
    defaults = sys.argv[3:] == ["defaults"]
    result = check(Path(sys.argv[1]), "" if defaults else AGENT_CONFIG)
    Path(sys.argv[2]).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("live", "same_everywhere")}, indent=1))
