"""Run ``vramscope agent`` as a real child process: for the tests and the benchmarks.

Starts ``vramscope agent`` (through ``vramscope.agent.cli.cmd_agent.main``) on a given socket and
database, waits until the socket answers a status request, and stops it with a signal of the
caller's choice (SIGTERM for a clean stop with final flush, SIGKILL for the crash test,
SIGSTOP/SIGCONT for a hung agent).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
# `vramscope agent` without importing the other subcommands (flask, plotly...).
_MAIN = ("import sys; from vramscope.agent.cli.cmd_agent import main; "
         "sys.exit(main(sys.argv[1:]))")


class AgentProcess:
    def __init__(self, db_url: str, socket_path: str, *, fake_devices: int = 0,
                 nvml: bool = False, config_path: str | None = None,
                 env: dict[str, str] | None = None,
                 log_path: str | None = None, extra_args: tuple[str, ...] = (),
                 nofile: int | None = None) -> None:
        self.db_url = db_url
        self.socket_path = socket_path
        self.fake_devices = fake_devices
        self.nvml = nvml  # sample the real NVML (GPU tests); else fake devices or none
        self.config_path = config_path
        self.env = env or {}
        self.log_path = log_path
        self.extra_args = tuple(extra_args)
        self.nofile = nofile  # RLIMIT_NOFILE soft limit for the child (systemd's LimitNOFILE)
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-c", _MAIN, "--db", self.db_url, "--socket", self.socket_path]
        if self.fake_devices:
            cmd += ["--fake-devices", str(self.fake_devices)]
        elif not self.nvml:
            cmd += ["--no-nvml"]
        if self.config_path:
            cmd += ["--config", self.config_path]
        return cmd + list(self.extra_args)

    def start(self, timeout_s: float = 20.0) -> AgentProcess:
        env = {**os.environ, **self.env}  # the child imports the installed vramscope, as we do
        out: Any = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(self.command(), env=env, stdout=out, stderr=out,
                                     cwd=str(REPO_ROOT), preexec_fn=self._limits())
        if out is not subprocess.DEVNULL:
            out.close()
        self.wait_ready(timeout_s)
        return self

    def _limits(self) -> Callable[[], None] | None:
        if self.nofile is None:
            return None
        nofile = self.nofile

        def apply() -> None:  # in the child, before exec (as systemd applies LimitNOFILE)
            import resource

            _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
        return apply

    def rss_bytes(self) -> int:
        """The child's resident memory now (Linux ``/proc``)."""
        with open(f"/proc/{self._child.pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS line")

    def wait_ready(self, timeout_s: float) -> None:
        from vramscope.agent.ingest.connection import AgentConnection

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._child.poll() is not None:
                raise RuntimeError(f"agent exited with {self._child.returncode} while starting"
                                   + self._log_tail())
            try:
                with AgentConnection(self.socket_path, timeout_s=2.0) as conn:
                    conn.status()
                return
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.02)
        raise TimeoutError(f"agent did not answer on {self.socket_path} in {timeout_s} s"
                           + self._log_tail())

    def status(self) -> dict[str, Any]:
        from vramscope.agent.ingest.connection import AgentConnection

        with AgentConnection(self.socket_path, timeout_s=5.0) as conn:
            return conn.status()

    def send_signal(self, signum: int) -> None:
        self._child.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        """Signal the agent and wait for it to exit; returns its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    @property
    def pid(self) -> int:
        return self._child.pid

    @property
    def _child(self) -> subprocess.Popen[bytes]:
        if self.proc is None:
            raise RuntimeError("the agent process is not started; call start() first")
        return self.proc

    def _log_tail(self) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return "\n--- agent log ---\n" + fh.read()[-3000:]

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(signal.SIGKILL if exc[0] else signal.SIGTERM)

