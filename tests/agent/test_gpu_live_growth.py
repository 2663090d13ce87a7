"""Issue 44's GPU check run LIVE: the `vramscope agent` of commit 72a08dc on its defaults beside a
server that grows to a real torch OutOfMemoryError and a healthy one restarted mid-run, on an
H100 (docs/gpu-runs/2026-12-07/live/, docs/gpu-verification.md section 20), and a shorter fill on
the agent of a day before (docs/gpu-runs/2026-12-06/live/today/). Nothing is replayed: the
figures are the verdict and alert rows the agent stored as the servers ran
(tests/gpu/live_growth_figures.py), against the servers' own truth (their JSON and timeline)."""

import json

import pytest

from tests.gpu.live_growth_figures import figures
from tools.agent_process import REPO_ROOT

RUNS = REPO_ROOT / "docs" / "gpu-runs"
LIVE = {"ten_min": RUNS / "2026-12-07" / "live", "four_min": RUNS / "2026-12-06" / "live" / "today"}


@pytest.fixture(scope="module")
def runs():
    return {name: figures(run) for name, run in LIVE.items()}


@pytest.mark.parametrize("name", sorted(LIVE))
def test_the_committed_figures_are_what_the_stored_run_gives(runs, name):
    assert runs[name] == json.loads((LIVE[name] / "figures.json").read_text())


def test_ten_minute_growth_is_named_with_its_pid_early_and_forecast_over_half_its_time_ahead(runs):
    f = runs["ten_min"]
    assert (f["grower"], f["onset_after_t0_s"], f["oom_after_onset_s"]) == (685, 210.0, 611.5)
    leak = f["first_leak"]
    # named 65 s after the onset (within max(3 min, 10 % of the fill)), 9.1 min before the OOM
    assert (leak["after_onset_s"], leak["before_oom_s"]) == (65.0, 546.5)
    assert leak["before_oom_s"] >= f["oom_after_onset_s"] / 2
    # the rate's 90 % interval and the forecast's hold the truth (123.1 MB/s; 546.5 s left)
    assert (leak["rate_mb_s"], f["true_rate_mb_s"]) == ([123.4, 104.9, 141.9], 123.1)
    assert leak["time_to_oom_s"] == [546.1, 474.8, 642.4]
    warning, critical = f["risk_before_oom"]  # two level changes before the OOM, no flapping
    assert (warning["level"], warning["cause"], warning["before_oom_s"]) == (
        "warning", "growth", 546.4)
    assert warning["time_to_oom_s"] == [539.1, 468.8, 634.3]  # holds the 546.4 s left
    assert (critical["level"], critical["cause"], critical["before_oom_s"]) == (
        "critical", "growth", 312.3)
    assert critical["time_to_oom_s"] == [300.0, 298.5, 301.4]  # 3.9 % short, outside it
    fired = {rule: (before, message) for rule, before, _, message in f["alerts"]}
    assert fired["memory_leak"][1].endswith("full in about 9.1 min (7.9 min to 10.7 min) [pid 685]")
    assert all("; likely growth;" in fired[r][1] and "[pid 685]" in fired[r][1]
               for r in ("oom_risk", "oom_risk_critical"))


def test_the_healthy_server_and_its_restart_are_never_a_leak_and_the_victim_names_the_grower(runs):
    f = runs["ten_min"]
    assert f["healthy"] == [518, 942] and f["healthy_leak_states"] == ["insufficient_data"]
    # the restart, on a device the grower had filled to 4.6 GiB free: a warning 10.4 s before
    # the OOM, cause growth, stored as at risk from pid 685's growth; no alert of its own
    assert f["healthy_risk"] == [[942, 10.4, "warning", "growth", ["headroom"], 4.6]]
    assert f["healthy_at_risk_from"] == [[942, 685]]


def test_after_the_oom_the_risk_ends_at_once_the_leak_stays_and_each_exit_ends_its_process(runs):
    f = runs["ten_min"]
    # the grower's rows from its OOM on: its leak stays the answer, its risk is ok; its
    # process_exit (atexit, after the torch OOM) ends it 2.6 s later
    assert f["after_oom"] == [[0.0, "leak", "ok", None, False], [2.6, "leak", "ok", None, True]]
    resolved = {rule: after for rule, _, after, _ in f["alerts"]}
    assert resolved == {"memory_leak": -2.6, "oom_risk": 0.0, "oom_risk_critical": 0.0,
                        "oom": None}
    leak_alert = next(a for a in f["alerts"] if a[0] == "memory_leak")
    assert leak_alert[1:3] == [546.5, -2.6]
    # every server's `ended` row comes with its process_exit, before the supervisor saw the
    # process gone (its CUDA context's teardown), not a minute of silence later
    assert f["ended"] == [[518, -2.2], [685, -1.8], [942, -1.7]]
    # one cause on every surface: the post-mortem, analyze's OOM line, every alert
    assert (f["postmortem_causes"], f["analyze_oom_cause"]) == (["growth"], "growth")
    # analyze after the run: the grower's line keeps its leak, ended; the device's leak answer
    # is the leak that ran in it, with its pid
    assert f["analyze_grower"] == ["leak", "ok", True]
    assert f["analyze_leak"] == [685, "leak"]


def test_a_four_minute_fill_from_75_s_is_named_and_forecast_over_half_its_time_ahead(runs):
    # growth that fills torch's limit in 3.6 min, starting 75 s into the process
    f = runs["four_min"]
    assert (f["grower"], f["onset_after_t0_s"], f["oom_after_onset_s"]) == (651, 75.0, 214.4)
    leak = f["first_leak"]
    # named 98.8 s after the onset (within 3 min), 115.5 s before the OOM: over half of 214.4
    assert (leak["after_onset_s"], leak["before_oom_s"]) == (98.8, 115.5)
    assert leak["before_oom_s"] >= f["oom_after_onset_s"] / 2
    # the rate's interval and the forecast's hold the truth (351.5 MB/s; 115.5 s left)
    assert (leak["rate_mb_s"], f["true_rate_mb_s"]) == ([352.7, 299.8, 405.6], 351.5)
    assert leak["time_to_oom_s"] == [114.9, 100.0, 135.2]
    (critical,) = f["risk_before_oom"]  # straight to critical, cause growth, no flapping
    assert (critical["level"], critical["cause"], critical["before_oom_s"]) == (
        "critical", "growth", 115.4)
    fired = {rule: (before, message) for rule, before, _, message in f["alerts"]}
    assert all("[pid 651]" in fired[r][1] for r in ("memory_leak", "oom_risk"))
    assert "; likely growth;" in fired["oom_risk_critical"][1]
    # after the OOM: the leak stays its answer, the risk ends; one cause on every surface
    assert f["after_oom"] == [[0.0, "leak", "ok", None, False]]
    assert (f["postmortem_causes"], f["analyze_oom_cause"]) == (["growth"], "growth")
    assert (f["analyze_leak"], f["analyze_grower"]) == ([651, "leak"], ["leak", "ok", False])
    # the healthy server and its restart: never a leak; the restart warned 2.1 s before the
    # OOM on a device filled to 4.6 GiB free, cause growth
    assert (f["healthy"], f["healthy_leak_states"]) == ([509, 897], ["insufficient_data"])
    assert f["healthy_risk"] == [[897, 2.1, "warning", "growth", ["headroom"], 4.6]]
