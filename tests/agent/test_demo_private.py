"""The demo is private (issue 45, item 8): its agent listens on a socket of its own, in a 0700
folder of its own, never on the host's default socket, where the servers' hooks on the machine
look for the real agent (three unrelated processes connected to a demo's agent and landed in
its database). A real agent on the default socket, or a second demo, is not disturbed."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _listening(path: Path) -> socket.socket:
    """A stand-in for the host's real agent: a socket listening on the default path."""
    path.parent.mkdir(mode=0o700, parents=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    server.setblocking(False)
    return server


def _demo(folder: Path, runtime: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": str(folder),
           "XDG_RUNTIME_DIR": runtime, "XDG_DATA_HOME": str(folder)}
    env.pop("VRAMSCOPE_AGENT_SOCKET_PATH", None)
    return subprocess.Popen(
        [sys.executable, "-m", "vramscope", "demo", "--duration", "6", "--history-min", "5",
         "--no-browser", "--port", "0", "--db", str(folder / "demo.db")],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _check_own_socket(line: str, default: Path) -> Path:
    """The socket the demo names: not the default, a socket, in a 0700 folder of this user."""
    mine = Path(line.split("agent socket: ", 1)[1].split(" ", 1)[0])
    assert mine != default and mine.parent != default.parent
    assert stat.S_ISSOCK(mine.stat().st_mode)
    folder = mine.parent.stat()
    assert (stat.S_IMODE(folder.st_mode), folder.st_uid) == (0o700, os.getuid())
    return mine


@pytest.mark.slow
def test_the_demo_listens_on_its_own_socket_and_leaves_the_real_agents_alone(
        tmp_path, short_dir):
    default = Path(short_dir) / "vramscope" / "agent.sock"
    real_agent = _listening(default)
    inode = default.stat().st_ino
    proc = _demo(tmp_path, short_dir)
    mine, out = None, []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if "agent socket: " in line:  # while the demo runs
                mine = _check_own_socket(line, default)
        assert proc.wait(timeout=120) == 0, "".join(out)[-3000:]
    finally:
        proc.kill()
        proc.wait()
    try:
        assert mine is not None, "the demo named no socket of its own:\n" + "".join(out)
        assert not mine.parent.exists()  # removed with the demo
        assert "ingest socket off" not in "".join(out)
        # the real agent's socket is untouched, and nothing of the demo connected to it
        assert default.stat().st_ino == inode
        with pytest.raises(BlockingIOError):
            real_agent.accept()
    finally:
        real_agent.close()


def test_two_demos_get_two_private_folders_and_one_ending_leaves_the_other():
    from vramscope.agent.sim.demo import private_socket

    with private_socket() as first:
        with private_socket() as second:
            assert Path(first).parent != Path(second).parent
            for path in (first, second):
                folder = Path(path).parent.stat()
                assert stat.S_IMODE(folder.st_mode) == 0o700
        assert Path(first).parent.is_dir() and not Path(second).parent.exists()
    assert not Path(first).parent.exists()


def _end_demos(cmd_demo, since: int) -> None:
    """As if the demos whose files were held after the first ``since`` locks had ended."""
    held = getattr(cmd_demo, "_HELD", [])  # (the old code held none)
    for lock in held[since:]:
        lock.close()
    del held[since:]


def test_a_second_demo_takes_a_database_of_its_own_and_leaves_the_running_ones(
        tmp_path, monkeypatch):
    """Each demo without --db starts demo.db afresh, by deleting it: a second demo deleted the
    database of the one still running. A running demo holds its file now (a lock beside it),
    and a second one takes the next free file."""
    from vramscope.agent.cli import cmd_demo

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    since = len(getattr(cmd_demo, "_HELD", []))
    try:
        first = Path(cmd_demo._fresh_demo_database().removeprefix("sqlite:///"))
        first.write_bytes(b"the running demo's data")
        second = Path(cmd_demo._fresh_demo_database().removeprefix("sqlite:///"))
        assert (first.name, second.name) == ("demo.db", "demo-2.db")
        assert first.read_bytes() == b"the running demo's data"
    finally:
        _end_demos(cmd_demo, since)
    try:  # both ended: the next demo starts demo.db afresh
        assert cmd_demo._fresh_demo_database().endswith("/vramscope/demo.db")
        assert not first.exists()
    finally:
        _end_demos(cmd_demo, since)
