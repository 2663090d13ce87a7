"""Embedded mode: the agent's sampler, writer (and optionally its ingest socket) as threads
of the calling process — for notebooks, single-process servers and the demo (usage:
docs/agent.md, "Embedded mode").

The composition runs from this side: the hooks never import the agent (docs/architecture.md,
"Direction of imports"); they only see ``agent.sink``, a ``RecordSink`` whose ``put`` never
blocks (a lock held for a deque append) and never raises; when the queue is full the oldest
record is dropped and counted, as in the sidecar.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.daemon import Agent
from vramscope.agent.errors import VramscopeError
from vramscope.agent.records import PostMortem
from vramscope.agent.writer import Record, Writer

if TYPE_CHECKING:
    from vramscope.agent.config import Config
    from vramscope.agent.sources.nvml import DeviceSource
    from vramscope.agent.store import Store
    from vramscope.hooks.install import InstallReport

log = logging.getLogger("vramscope.embedded")


class WriterSink:
    """A ``RecordSink`` into the writer's bounded queue, filling in this process's pid."""

    def __init__(self, writer: Writer, pid: int | None = None) -> None:
        self._writer = writer
        self._pid = os.getpid() if pid is None else pid
        self.errors = 0

    def put(self, record: Record) -> None:
        try:
            if record.pid is None and not isinstance(record, PostMortem):
                record = record._replace(pid=self._pid)
            self._writer.put(record)
        except Exception:  # noqa: BLE001 - a sink never raises into the server
            self.errors += 1

    def close(self) -> None:
        """Nothing to release: the agent's ``stop()`` does the final flush."""

    @property
    def dropped(self) -> int:
        return self._writer.stats.dropped_total


class EmbeddedAgent:
    """The agent in this process. ``listen=True`` also serves the socket for other processes
    (skipped with one log line when another agent already listens there)."""

    def __init__(self, config: Config | None = None, db_url: str | None = None, *,
                 source: DeviceSource | Literal["nvml"] | None = "nvml", listen: bool = False,
                 socket_path: str | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        if config is None:
            from vramscope.agent.config import load_config

            config = load_config()
        self.agent = Agent(config, db_url=db_url, source=source, socket_path=socket_path,
                           listen=listen, clock=clock)
        self.sink = WriterSink(self.agent.writer)
        self._started = False

    @property
    def store(self) -> Store:
        return self.agent.store

    def start(self) -> EmbeddedAgent:
        if self._started:
            return self
        try:
            self.agent.start()
        except VramscopeError as exc:
            if self.agent.server is None:
                raise
            log.warning("embedded agent: ingest socket off (%s); the in-process sink works", exc)
            self.agent.server = None
            self.agent.start()
        self._started = True
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._started:
            self.agent.stop(timeout_s)
            self._started = False
        else:
            self.agent.writer.flush()

    def status(self) -> dict[str, Any]:
        return self.agent.status()

    def __enter__(self) -> EmbeddedAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class EmbeddedInstall:
    """What :func:`install_embedded` started: the agent (None when it could not start) and the
    hooks' report. ``stop()`` turns the hooks off, then stops the agent with a final flush."""

    agent: EmbeddedAgent | None
    report: InstallReport

    def stop(self, timeout_s: float = 10.0) -> None:
        from vramscope.hooks.install import uninstall

        uninstall()
        if self.agent is not None:
            self.agent.stop(timeout_s)

    def __enter__(self) -> EmbeddedInstall:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def install_embedded(config: Config | None = None, *, db_url: str | None = None,
                     listen: bool = False, devices: list[int] | None = None) -> EmbeddedInstall:
    """Start an :class:`EmbeddedAgent` and install the hooks with its sink. Never raises: an
    agent that cannot start (a bad config file, a database it cannot open) is an
    ``embedded_agent`` line of the report, and the hooks count and drop their records."""
    from vramscope.hooks.install import install, installed
    from vramscope.hooks.install_sinks import DropSink

    if installed():  # its records already go somewhere: no second agent to feed nothing
        return EmbeddedInstall(None, install(config))
    try:
        agent = EmbeddedAgent(config, db_url, listen=listen).start()
    except Exception as exc:  # noqa: BLE001 - like install(), never into the server
        log.warning("vramscope: the embedded agent cannot start: %s", exc)
        report = install(config, sink=DropSink(), devices=devices)
        report.add("embedded_agent", False, f"cannot start ({exc}); records are counted and "
                                            f"dropped")
        return EmbeddedInstall(None, report)
    report = install(agent.agent.config, sink=agent.sink, devices=devices)
    report.add("embedded_agent", True, f"writing {agent.store.safe_url}")
    return EmbeddedInstall(agent, report)
