"""A real agent for the robustness tests, and a client of it in a process of its own.

:func:`running_agent` starts an :class:`~vramscope.agent.daemon.Agent` on a real store with the
settings a test names, on the test's clock, without a device source or an alert engine.

:class:`OtherProcess` is a second client in a process of its own (``python -m
tests.support.live_agent SOCKET NAME``): the agent's write budget and its rare-events cap are
per client process, and every connection the test opens itself shares the test's one. Told
``KIND N START`` on its stdin, it sends N records of :data:`OTHER_PID` from START (``samples``,
or ``oom`` events: a rare event) and answers with what the agent had refused by then, as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vramscope.agent.clock import Clock
from vramscope.agent.config import parse_config
from vramscope.agent.daemon import Agent
from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.store import Store

OTHER_PID = 7002  # the pid OtherProcess's records name
ROOT = Path(__file__).resolve().parents[2]  # where ``tests.support`` imports from


@contextmanager
def running_agent(url: str, short_dir: str, clock: Clock, settings: Mapping[str, Any],
                  host: str = "agent-host") -> Iterator[Agent]:
    """An agent on the store at ``url`` with the config ``settings`` (``{"agent": {...}}``),
    listening at ``short_dir/run/a.sock``; stopped, and its store closed, on the way out."""
    store = Store.open(url, host_name=host)
    agent = Agent(parse_config(dict(settings), None, {}), store=store, source=None,
                  socket_path=f"{short_dir}/run/a.sock", clock=clock, alerts=False)
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()
        store.close()


class OtherProcess:
    """A client in a process of its own, connected until :meth:`close` (or the ``with``)."""

    def __init__(self, socket_path: str, name: str) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.live_agent", socket_path, name],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def send(self, kind: str, n: int, start: float) -> dict[str, int]:
        """Send ``n`` records of ``kind``; what the agent had refused by then, by reason."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(f"{kind} {n} {start!r}\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        assert line, f"the other client exited with {self._proc.wait(30)}"
        return json.loads(line)

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        assert self._proc.wait(30) == 0

    def __enter__(self) -> OtherProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _records(kind: str, n: int, start: float) -> list[Sample] | list[Event]:
    if kind == "samples":
        return [Sample(start + i * 1e-3, 0, Phase.DECODE, "torch", OTHER_PID, allocated_bytes=i)
                for i in range(n)]
    if kind == "oom":
        return [Event(start + i * 1e-3, "oom", 0, OTHER_PID, data={"i": i}) for i in range(n)]
    raise ValueError(f"record kind {kind!r}: samples or oom")


def main(socket_path: str, name: str) -> int:
    with AgentConnection(socket_path) as conn:
        conn.hello(name)
        for line in sys.stdin:
            kind, n, start = line.split()
            conn.send_records(_records(kind, int(n), float(start)))
            print(json.dumps(conn.status()["rejected"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
