"""``vramscope config check`` and the agent share one validator (issue 32, item 5; issue 34,
item 10): every problem of a file is reported, not only the first; settings that contradict
one another are refused; what the check passes the agent starts with, what it refuses the agent
refuses with the same words. Both run as real processes here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vramscope.agent.cli import main
from vramscope.agent.settings import SETTINGS

REPO = Path(__file__).resolve().parents[2]

BAD = """\
[agent]
allowed_uids = "1,abc,-5"
batch_rows = 0
[alerts]
headroom_warning_ratio = 0.01
headroom_critical_ratio = 0.02
time_to_oom_warning_s = 100.0
[dashbord]
port = 1
[[alerts.rules]]
name = "x"
metric = "allocated_bytes"
op = "~"
threshold = 1
"""


def _problems(path: Path) -> list[str]:
    return [
        f"{path}: unknown section [dashbord] (did you mean [dashboard]?); known: agent, alerts, "
        "dashboard, database, hooks, retention, sampling, server, sources",
        f"{path}: agent.allowed_uids = '1,abc,-5': 'abc', '-5' are not uids (expected numbers "
        "separated by commas)",
        f"{path}: agent.batch_rows = 0 is out of range; allowed: 1 to 1e+06",
        f"{path}: alerts.headroom_warning_ratio = 0.01 is below alerts.headroom_critical_ratio = "
        "0.02; a warning must come before the critical level, so its threshold must be at "
        "least as large",
        f"{path}: alerts.time_to_oom_warning_s = 100.0 is below alerts.time_to_oom_critical_s = "
        "300.0; a warning must come before the critical level, so its threshold must be at "
        "least as large",
        f"{path}: alert rule 'x': op = '~' is not one of >, >=, <, <=, ==, !=",
    ]


def _agent(config: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": str(folder),
           "XDG_RUNTIME_DIR": str(folder), "XDG_DATA_HOME": str(folder)}
    return subprocess.run([sys.executable, "-m", "vramscope", "agent", "--config", str(config),
                           "--no-nvml", "--db", str(folder / "a.db"), "--socket",
                           str(folder / "a.sock")], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=60)


def test_check_reports_every_problem_of_a_file(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(BAD)
    assert main(["config", "check", str(path)]) == 1  # the old code: the first problem only
    err = capsys.readouterr().err.splitlines()
    assert err == [f"vramscope: error: {p}" for p in _problems(path)] + [
        f"{path}: 6 problems; the agent would refuse to start"]


def test_the_agent_refuses_the_same_file_with_the_same_problems(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(BAD)
    proc = _agent(path, tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"vramscope: error: {p}" for p in _problems(path)]
    assert not (tmp_path / "a.db").exists()  # refused before anything was opened


def test_uids_the_agent_refuses_fail_the_check(tmp_path, capsys):
    """Issue 32, item 5: the check passed `"1,abc,-5"` (exit 0) that the agent refused."""
    path = tmp_path / "uids.toml"
    path.write_text('[agent]\nallowed_uids = "1,abc,-5"\n')
    assert main(["config", "check", str(path)]) == 1
    problem = (f"{path}: agent.allowed_uids = '1,abc,-5': 'abc', '-5' are not uids (expected "
               "numbers separated by commas)")
    assert capsys.readouterr().err == f"vramscope: error: {problem}\n"
    proc = _agent(path, tmp_path)
    assert (proc.returncode, proc.stderr) == (1, f"vramscope: error: {problem}\n")


def test_a_warning_threshold_equal_to_its_critical_one_is_allowed(tmp_path, capsys):
    path = tmp_path / "equal.toml"
    path.write_text('[agent]\nallowed_uids = " 1000, 1001 "\n[alerts]\n'
                    'time_to_oom_warning_s = 300.0\nheadroom_warning_ratio = 0.02\n')
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: ok ({len(SETTINGS)} settings, 6 alert rules)\n"


def test_an_environment_override_is_checked_with_the_file(tmp_path, capsys, monkeypatch):
    path = tmp_path / "ok.toml"
    path.write_text("[alerts]\ntime_to_oom_critical_s = 600.0\n")
    monkeypatch.setenv("VRAMSCOPE_ALERTS_TIME_TO_OOM_WARNING_S", "500")
    assert main(["config", "check", str(path)]) == 1
    assert capsys.readouterr().err.splitlines()[0] == (
        f"vramscope: error: {path}: alerts.time_to_oom_warning_s = 500.0 is below "
        "alerts.time_to_oom_critical_s = 600.0; a warning must come before the critical level, "
        "so its threshold must be at least as large")
