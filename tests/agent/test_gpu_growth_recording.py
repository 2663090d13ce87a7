"""The H100 recording of issue 44's GPU check (docs/gpu-runs/2026-12-06/main, docs/
gpu-verification.md section 20), replayed through today's alert engine in one-second batches,
as the agent's writer feeds it: a never-idle server keeping 134 MiB a second from 210 s after
its start until the full device killed it (through cuDNN, at about 827 s), beside a healthy
server restarted at half time."""

import json

import pytest
from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.ingest.process import REPO_ROOT

from tests.support.gpu_replay import records, replay, unpacked

RUN = REPO_ROOT / "docs" / "gpu-runs" / "2026-12-06" / "main"
GROWER, HEALTHY, RESTARTED = 698, 537, 988


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("h100")
    engine = AlertEngine.from_config(None)
    changes = replay(engine, records(unpacked(RUN / "growth_oom.db.gz", tmp), tmp))
    return engine, changes, json.loads((RUN / "meta.json").read_text())["start_ts"]


def test_the_grower_is_named_with_its_pid_and_forecast_minutes_before_it_died(replayed):
    engine, changes, t0 = replayed
    fired = [(c.rule, round(c.ts_s - t0, 1)) for c in changes if c.kind == "fired"]
    # its first tensor kept at 227 s (the recording's start, before its model loaded, is t0);
    # the device full and the grower dead at about 843 s, 8.6 min after the leak was named
    assert fired == [("memory_leak", 312.2), ("oom_risk", 327.4),
                     ("oom_risk_critical", 543.7)]
    leak, warning, critical = (c for c in changes if c.kind == "fired")
    assert leak.message.endswith(f"full in about 9.4 min (8.2 min to 11.0 min) [pid {GROWER}]")
    # the truth: 569 tensors of 134 MiB kept over 616 s, 434 GiB/h
    grow = json.loads((RUN / "cb-grow.json").read_text())
    span = grow["last_kept_ts"] - grow["first_kept_ts"]
    truth = (grow["kept_tensors"] - 1) * 140_509_184 / span
    assert round(truth * 3600 / 2**30) == 434 and "433.35 GiB/h" in leak.message
    assert warning.message.startswith(f"OOM risk warning [pid {GROWER}]: the floor growing")
    assert "OOM in 8.5 min" in warning.message and "; likely growth;" in warning.message
    assert "OOM in 5.0 min" in critical.message and "; likely growth;" in critical.message


def test_the_healthy_server_and_its_restart_are_never_a_leak_and_the_dead_grower_ends(replayed):
    engine, _, t0 = replayed
    rows = engine.verdicts.history
    by_pid = {p: [v for v in rows if v.pid == p] for p in (GROWER, HEALTHY, RESTARTED)}
    assert all(v.leak_state != "leak" for p in (HEALTHY, RESTARTED) for v in by_pid[p])
    # the restarted server, near the limit as the grower filled the device, is at risk from it
    risky = [v for v in by_pid[RESTARTED] if v.risk_level != "ok"]
    assert (round(risky[0].ts_s - t0, 1), risky[0].risk_cause) == (801.0, "growth")
    assert {v.risk_cause for v in by_pid[GROWER] if v.risk_level != "ok"} == {"growth"}
    last = by_pid[GROWER][-1]  # a minute after its last sample: it ended, and its risk with it
    assert (round(last.ts_s - t0, 1), last.ended, last.risk_level, last.time_to_oom_s) == (
        915.7, True, "ok", None)
