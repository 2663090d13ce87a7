"""Issue 44's GPU check run LIVE: today's `vramscope agent` on its defaults beside a server that
grows to a real torch OutOfMemoryError and a healthy one restarted mid-run, on an H100
(docs/gpu-runs/2026-12-06/live/, docs/gpu-verification.md section 21). Nothing is replayed: the
figures are the verdict and alert rows the agent stored as the servers ran
(tests/gpu/live_growth_figures.py), against the servers' own truth (their JSON and timeline)."""

import json

import pytest
from vramscope.agent.ingest.process import REPO_ROOT

from tests.gpu.live_growth_figures import figures

LIVE = REPO_ROOT / "docs" / "gpu-runs" / "2026-12-06" / "live"


@pytest.fixture(scope="module")
def runs():
    return {name: figures(LIVE / name) for name in ("main", "short", "today")}


@pytest.mark.parametrize("name", ["main", "short", "today"])
def test_the_committed_figures_are_what_the_stored_run_gives(runs, name):
    assert runs[name] == json.loads((LIVE / name / "figures.json").read_text())


def test_ten_minute_growth_is_named_with_its_pid_early_and_forecast_within_two_percent(runs):
    f = runs["main"]
    assert (f["grower"], f["onset_after_t0_s"], f["oom_after_onset_s"]) == (700, 210.1, 614.5)
    leak = f["first_leak"]
    # named 81 s after the onset (within max(3 min, 10 % of the fill)), 8.9 min before the OOM
    assert (leak["after_onset_s"], leak["before_oom_s"]) == (80.9, 533.6)
    assert leak["before_oom_s"] >= f["oom_after_onset_s"] / 2
    # rate 1.2 % under the whole growth's mean; its 90 % interval (±0.2 %) leaves that out
    assert (leak["rate_mb_s"], f["true_rate_mb_s"]) == ([121.1, 120.9, 121.3], 122.5)
    assert leak["time_to_oom_s"] == [541.2, 540.3, 542.2]  # 533.6 s were left: 1.4 % long
    warning, critical = f["risk_before_oom"]  # two level changes before the OOM, no flapping
    assert (warning["level"], warning["cause"], warning["before_oom_s"]) == (
        "warning", "growth", 533.5)
    assert warning["time_to_oom_s"] == [534.2, 533.2, 535.1]  # its interval holds the truth
    assert (critical["level"], critical["cause"], critical["before_oom_s"]) == (
        "critical", "growth", 304.5)
    assert critical["time_to_oom_s"] == [299.0, 298.6, 299.4]  # 1.8 % short, outside it
    fired = {rule: (before, message) for rule, before, _, message in f["alerts"]}
    assert fired["memory_leak"][1].endswith("[pid 700]")
    assert all("; likely growth;" in fired[r][1] and "[pid 700]" in fired[r][1]
               for r in ("oom_risk", "oom_risk_critical"))


def test_the_healthy_server_and_its_restart_are_never_a_leak(runs):
    f = runs["main"]
    assert f["healthy"] == [549, 986] and f["healthy_leak_states"] == ["insufficient_data"]
    # the restart, on a device the grower had filled to 4.6 GiB free: a warning 10.6 s before
    # the OOM, cause growth; no alert of its own
    assert f["healthy_risk"] == [[986, 10.6, "warning", "growth", ["headroom"], 4.6]]


def test_after_the_oom_the_risk_ends_but_the_dead_pid_flickers_fragmentation_first(runs):
    f = runs["main"]
    assert f["after_oom"] == [
        [0.0, "insufficient_data", "ok", None, False],
        [0.1, "insufficient_data", "critical", "fragmentation", False],
        [0.2, "insufficient_data", "warning", "fragmentation", False],
        [1.1, "insufficient_data", "ok", None, False],
        [79.5, "insufficient_data", "ok", None, True]]
    resolved = {rule: after for rule, _, after, _ in f["alerts"]}
    assert resolved == {"memory_leak": -9.3, "oom_risk": -1.1, "oom_risk_critical": -1.1,
                        "oom": None}
    assert f["ended"] == [[549, 65.7], [700, 73.7]]
    # one OOM, two causes: the post-mortem's classifier says batch, analyze's says growth
    assert (f["postmortem_causes"], f["analyze_oom_cause"]) == (["batch"], "growth")
    # and `analyze` keeps no trace of the leak: the device's answer is the restart's, the dead
    # grower's last row says "not enough data yet"
    assert (f["analyze_leak"], f["analyze_grower"]) == (
        [986, "insufficient_data"], ["insufficient_data", "ok", True])


def test_a_three_minute_fill_from_40_s_is_named_in_2_2_min_only_66_s_before_its_oom(runs):
    f = runs["short"]
    assert (f["grower"], f["onset_after_t0_s"], f["oom_after_onset_s"]) == (1723, 40.1, 199.8)
    leak = f["first_leak"]
    assert (leak["after_onset_s"], leak["before_oom_s"]) == (133.8, 66.0)
    assert leak["before_oom_s"] < f["oom_after_onset_s"] / 2  # the lead: not met
    assert (leak["rate_mb_s"], f["true_rate_mb_s"]) == ([375.8, 374.7, 376.9], 376.3)
    (critical,) = f["risk_before_oom"]  # straight to critical, cause growth
    assert (critical["level"], critical["cause"], critical["time_to_oom_s"]) == (
        "critical", "growth", [64.3, 64.1, 64.5])
    assert f["healthy_leak_states"] == ["insufficient_data"]
    assert f["healthy_risk"] == [[1915, 1.0, "warning", "growth", ["headroom"], 4.7]]


def test_today_a_four_minute_fill_from_75_s_is_named_and_forecast_over_half_its_time_ahead(runs):
    # the agent of today's main (section 22): growth that fills torch's limit in 3.6 min,
    # starting 75 s into the process
    f = runs["today"]
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
