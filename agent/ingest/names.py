"""Bounds on the names clients create: hosts, devices (host, index) and processes (host, pid).

Every new name is a row (hosts, devices) or a series (processes) that every page, ``/metrics``
and retention step walks for as long as it is kept: one client sending 3,000 host names made
``/metrics`` 4 MB and 5-9 s. So a client (one connection) may bring at most ``CLIENT_LIMITS``
names the agent has not seen yet, and all clients together at most ``agent.max_hosts``,
``agent.max_devices`` and ``agent.max_processes`` (per agent run). A record that would create
a name beyond a bound is refused alone (counted as ``rejected["names"]``, one log line); the
names already admitted keep working, whoever sends them.

Cheap in the steady state: a batch's distinct (host, device, pid) triples are looked up in the
connection's own set of triples already admitted (a few per batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from vramscope.agent.records import Event, Sample

R = TypeVar("R", Sample, Event, Sample | Event)


class Counts(NamedTuple):
    hosts: int
    devices: int
    processes: int


# A hook client reports its own host, the devices it uses and its own pid (with workers: a
# few). The totals keep /metrics and the Overview under 300 ms: their cost grows with the
# devices (about 2-4 ms each on the 2-core development machine; tests/agent/
# test_robustness_names.py), much less with the processes.
CLIENT_LIMITS = Counts(hosts=2, devices=16, processes=64)
DEFAULT_LIMITS = Counts(hosts=8, devices=32, processes=256)
_CACHE_MAX = 4096  # triples a connection remembers as admitted; beyond, they are looked up again


@dataclass
class ClientNames:
    """One connection's share: the names it created and the triples it may send."""

    created: list[int] = field(default_factory=lambda: [0, 0, 0])
    admitted: set[tuple[str | None, int, int | None]] = field(default_factory=set)


class NameRefusal(NamedTuple):
    records: int  # records refused
    kind: str  # the first bound that was reached: "hosts", "devices" or "processes"
    limit: int
    per_client: bool


class NameLimits:
    def __init__(self, limits: Counts = DEFAULT_LIMITS,
                 client_limits: Counts = CLIENT_LIMITS) -> None:
        if min(*limits, *client_limits) < 1:
            raise ValueError(f"name limits must be >= 1, got {limits} and {client_limits}")
        self.limits, self.client_limits = limits, client_limits
        self.hosts: set[str | None] = {None}  # None: the agent's own host
        self.devices: set[tuple[str | None, int]] = set()
        self.processes: set[tuple[str | None, int]] = set()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> NameLimits:
        return cls(Counts(config["agent.max_hosts"], config["agent.max_devices"],
                          config["agent.max_processes"]))

    @property
    def counts(self) -> Counts:
        """Names known now (the agent's own host not counted)."""
        return Counts(len(self.hosts) - 1, len(self.devices), len(self.processes))

    def admit(self, records: Sequence[R], client: ClientNames
              ) -> tuple[Sequence[R], NameRefusal | None]:
        """The records whose names are known or may be created, and what was refused."""
        triples = {(r.host, r.device if r.device_uuid is None else -1, r.pid) for r in records}
        new = triples - client.admitted
        if not new:
            return records, None
        refused: dict[tuple[str | None, int, int | None], tuple[str, int, bool]] = {}
        for triple in sorted(new, key=repr):  # the same names win whatever the set's order
            why = self._admit_triple(triple, client)
            if why is None:
                if len(client.admitted) < _CACHE_MAX:
                    client.admitted.add(triple)
            else:
                refused[triple] = why
        if not refused:
            return records, None
        kept = [r for r in records
                if (r.host, r.device if r.device_uuid is None else -1, r.pid) not in refused]
        kind, limit, per_client = next(iter(refused.values()))
        return kept, NameRefusal(len(records) - len(kept), kind, limit, per_client)

    def _admit_triple(self, triple: tuple[str | None, int, int | None],
                      client: ClientNames) -> tuple[str, int, bool] | None:
        """None when every name of ``triple`` is known or was created now; else the bound."""
        host, device, pid = triple
        known: tuple[set[Any], set[Any], set[Any]] = (self.hosts, self.devices, self.processes)
        names = (host, (host, device) if device >= 0 else None,
                 (host, pid) if pid is not None else None)
        new = [kind for kind, name in enumerate(names)
               if name is not None and name not in known[kind]]
        for kind in new:  # every bound checked before any name is created
            if len(known[kind]) - (kind == 0) >= self.limits[kind]:  # hosts: not the own
                return Counts._fields[kind], self.limits[kind], False
            if client.created[kind] >= self.client_limits[kind]:
                return Counts._fields[kind], self.client_limits[kind], True
        for kind in new:
            known[kind].add(names[kind])
            client.created[kind] += 1
        return None

    @staticmethod
    def describe(refusal: NameRefusal) -> str:
        if refusal.per_client:
            return (f"{refusal.records} record(s) refused: this client already created "
                    f"{refusal.limit} new {refusal.kind}, the most one client may")
        return (f"{refusal.records} record(s) refused: {refusal.limit} {refusal.kind} are known "
                f"already, the most clients may create (agent.max_{refusal.kind})")
