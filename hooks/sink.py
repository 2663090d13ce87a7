"""Where in-server records go: the one-method seam between hooks and whatever ships them.

``RecordSink.put`` must never block and never raise: the inference server's thread calls it.
Implementations: ``ListSink`` (the fake, for tests), the socket client in ``vramscope.hooks.client``
(to a sidecar agent) and the embedded agent's sink in ``vramscope.agent.embedded``.
"""

from __future__ import annotations

import threading
from typing import Protocol

from vramscope.agent.records import Event, PostMortem, Sample

Record = Sample | Event | PostMortem


class RecordSink(Protocol):
    def put(self, record: Record) -> None:
        """Hand a record over without blocking; drop (and count) it if there is no room."""

    def close(self) -> None:
        """Flush what can be flushed quickly and release resources."""


class ListSink:
    """Keeps every record in memory, in order. A real fake: bounded, thread-safe, counts drops."""

    def __init__(self, max_records: int = 1_000_000) -> None:
        self.records: list[Record] = []
        self.dropped = 0
        self._max = max_records
        self._lock = threading.Lock()

    def put(self, record: Record) -> None:
        with self._lock:
            if len(self.records) >= self._max:
                self.dropped += 1
                return
            self.records.append(record)

    def close(self) -> None:
        pass

    def samples(self) -> list[Sample]:
        with self._lock:
            return [r for r in self.records if isinstance(r, Sample)]

    def events(self) -> list[Event]:
        with self._lock:
            return [r for r in self.records if isinstance(r, Event)]

    def postmortems(self) -> list[PostMortem]:
        with self._lock:
            return [r for r in self.records if isinstance(r, PostMortem)]
