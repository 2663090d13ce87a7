"""The README's "What you will see" is what a fresh clone prints (tests/walkthrough.py), and the
README keeps its two set-up commands."""

from __future__ import annotations

import re

from tests import walkthrough

README = walkthrough.README


def test_readme_section_is_what_the_walkthrough_prints():
    printed = walkthrough.transcript()
    shown = walkthrough.readme_section(README.read_text())
    assert shown == printed, (
        "README.md's 'What you will see' differs from what the commands print now: "
        "check the difference, then .venv/bin/python -m tests.walkthrough --update-readme")


def test_readme_has_exactly_two_setup_commands():
    """A fresh machine needs two commands: one installs and runs the demo, one the tests."""
    blocks = re.findall(r"^```sh\n(.*?)```$", README.read_text(), re.S | re.M)
    assert [b.strip() for b in blocks] == [
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/vramscope demo",
        "tests/run.sh",
    ]
    assert [s.args[0] for s in walkthrough.STEPS[:2]] == ["status", "demo"]


DEMO_OUTPUT = """\
2026-12-04 17:39:04,398 vramscope.agent INFO agent started: 3 NVML device(s), socket /s
vramscope demo: dashboard at http://127.0.0.1:40977/
  database: /d/demo.db (kept when the demo ends)
sim 0:01:41 | 98 min behind now | healthy: 1 running, 43 served, 0 OOM | 0 rows, 0 alerts
2026-12-04 17:39:09,581 vramscope.alerts WARNING alert fired oom_risk [warning] device 2 at x
sim 0:35:07 | 65 min behind now | healthy: 6 running, 860 served, 0 OOM | 4000 rows, 1 alerts
2026-12-04 17:39:24,794 vramscope.agent INFO agent stopped: 42881 rows written, 0 dropped
demo finished:
  simulation stopped 3.0 h behind real time: its newest data is from 2026-12-04T14:39:24Z
  device 2 (fragmentation): 4290 requests served, 157 aborted, 1 OOM
  alert memory_leak (warning, active) on device 1 at 2026-12-04T17:24:08.289Z
  alert oom (critical, resolved) on device 2 at 2026-12-04T16:19:29.789Z
  1 OOM post-mortem(s), 2 alert(s)
database kept: /d/demo.db; look at it again with 'vramscope dashboard --db /d/demo.db'
"""


def test_demo_output_keeps_its_fixed_lines_and_masks_what_varies():
    lines = walkthrough.normalise_demo(DEMO_OUTPUT.splitlines())
    assert lines == [
        "<time> vramscope.agent INFO agent started: 3 NVML device(s), socket /s",
        "vramscope demo: dashboard at http://127.0.0.1:<port>/",
        "  database: /d/demo.db (kept when the demo ends)",
        walkthrough._PROGRESS_LEFT_OUT,
        "demo finished:",
        "  device 2 (fragmentation): <n> requests served, <n> aborted, <n> OOM",
        walkthrough._ALERTS_LEFT_OUT,
        "  <n> OOM post-mortem(s), <n> alert(s)",
        "database kept: /d/demo.db; look at it again with 'vramscope dashboard --db /d/demo.db'",
    ]


def test_normalise_masks_the_home_the_clock_the_host_and_the_size_only(tmp_path):
    import socket

    host = socket.gethostname()
    text = (f"database: sqlite:///{tmp_path}/v.db, 0.2 MiB\n"
            "  0: last seen 2026-11-29T16:34:29.413Z (5.0 days ago)\n"
            f"  {host} GPU 0 pid 421 (?): not enough data yet\n"
            "  OOM at 2026-11-29T16:34:28.387Z (warned 0.0 s before)   \n")
    assert walkthrough.normalise(text, tmp_path, demo=False).splitlines() == [
        "database: sqlite:////home/you/v.db, <n> MiB",
        "  0: last seen 2026-11-29T16:34:29.413Z (<age> ago)",
        "  <host> GPU 0 pid 421 (?): not enough data yet",
        "  OOM at 2026-11-29T16:34:28.387Z (warned 0.0 s before)",
    ]
