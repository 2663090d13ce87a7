"""Issue 44's GPU check run LIVE: the `vramscope agent` of commit 7841150 on its defaults beside a
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
    assert (f["grower"], f["onset_after_t0_s"], f["oom_after_onset_s"]) == (667, 210.1, 603.8)
    leak = f["first_leak"]
    # named 62.6 s after the onset (within max(3 min, 10 % of the fill)), 9 min before the OOM
    assert (leak["after_onset_s"], leak["before_oom_s"]) == (62.6, 541.1)
    assert leak["before_oom_s"] >= f["oom_after_onset_s"] / 2
    # the rate's 90 % interval and the forecast's hold the truth (124.7 MB/s; 541.1 s left)
    assert (leak["rate_mb_s"], f["true_rate_mb_s"]) == ([124.1, 105.5, 142.7], 124.7)
    assert leak["time_to_oom_s"] == [544.8, 473.8, 641.0]
    warning, critical = f["risk_before_oom"]  # two level changes before the OOM, no flapping
    assert (warning["level"], warning["cause"], warning["before_oom_s"]) == (
        "warning", "growth", 541.0)
    assert warning["time_to_oom_s"] == [536.9, 466.9, 631.7]  # holds the 541.0 s left
    assert (critical["level"], critical["cause"], critical["before_oom_s"]) == (
        "critical", "growth", 313.9)
    assert critical["time_to_oom_s"] == [300.0, 299.1, 300.9]  # 4.4 % short, outside it
    fired = {rule: (before, message) for rule, before, _, message in f["alerts"]}
    assert fired["memory_leak"][1].endswith("full in about 9.1 min (7.9 min to 10.7 min) [pid 667]")
    assert all("; likely growth;" in fired[r][1] and "[pid 667]" in fired[r][1]
               for r in ("oom_risk", "oom_risk_critical"))


def test_the_healthy_server_and_its_restart_are_never_a_leak_and_the_victim_names_the_grower(runs):
    f = runs["ten_min"]
    assert f["healthy"] == [530, 929] and f["healthy_leak_states"] == ["insufficient_data"]
    # the restart, on a device the grower had filled to 4.6 GiB free: a warning 13.4 s before
    # the OOM, cause growth, stored as at risk from pid 667's growth; no alert of its own
    assert f["healthy_risk"] == [[929, 13.4, "warning", "growth", ["headroom"], 4.6]]
    assert f["healthy_at_risk_from"] == [[929, 667]]


def test_after_the_oom_the_risk_ends_at_once_the_leak_stays_and_each_exit_ends_its_process(runs):
    f = runs["ten_min"]
    # the grower's rows from its OOM on: its leak stays the answer, its risk is ok; its
    # process_exit (atexit, after the torch OOM) ends it 2.3 s later
    assert f["after_oom"] == [[0.0, "leak", "ok", None, False], [2.3, "leak", "ok", None, True]]
    resolved = {rule: after for rule, _, after, _ in f["alerts"]}
    assert resolved == {"memory_leak": -2.3, "oom_risk": 0.0, "oom_risk_critical": 0.0,
                        "oom": None}
    leak_alert = next(a for a in f["alerts"] if a[0] == "memory_leak")
    assert leak_alert[1:3] == [541.1, -2.3]
    # every server's `ended` row comes with its process_exit, before the supervisor saw the
    # process gone (its CUDA context's teardown), not a minute of silence later
    assert f["ended"] == [[530, -1.3], [667, -1.3], [929, -1.0]]
    # one cause on every surface: the post-mortem, analyze's OOM line, every alert
    assert (f["postmortem_causes"], f["analyze_oom_cause"]) == (["growth"], "growth")
    # analyze after the run: the grower's line keeps its leak, ended; the device's leak answer
    # is the leak that ran in it, with its pid
    assert f["analyze_grower"] == ["leak", "ok", True]
    assert f["analyze_leak"] == [667, "leak"]


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
