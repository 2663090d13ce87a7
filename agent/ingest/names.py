"""Bounds on the names clients keep alive: hosts, devices (host, index) and processes (host, pid).

Every new name is a row or a series that every page, ``/metrics`` and retention step walks for
as long as it is kept (one client sending 3,000 host names made ``/metrics`` 4 MB and 5-9 s), so
names per client, live names in all and distinct names per run are bounded; a record beyond a
bound is refused alone and counted (docs/agent.md, "Limits per client and per name"). A batch's
few distinct (host, device, pid) triples are looked up in three dicts; expired names are swept
only when a bound is reached, at most once a second.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any, NamedTuple, TypeVar

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.records import Event, Sample

R = TypeVar("R", Sample, Event, Sample | Event)
Name = Any  # a host (str), a device (host, index) or a process (host, pid)
Triple = tuple[str | None, int, int | None]


class Counts(NamedTuple):
    hosts: int
    devices: int
    processes: int


# A hook client reports its own host, the devices it uses and its own pid (with workers: a
# few). The totals keep /metrics and the Overview within their 300 ms budget (`vramscope bench
# dashboard`): their cost grows with the devices, each read for its newest state, much less
# with the processes.
CLIENT_LIMITS = Counts(hosts=2, devices=16, processes=64)
DEFAULT_LIMITS = Counts(hosts=8, devices=32, processes=256)
DEFAULT_IDLE_S = 300.0
EVER_FACTOR = 4  # distinct hosts / devices an agent run creates, times the live bound
_SWEEP_EVERY_S = 1.0  # a flood of refused names rescans the live names at most this often
_ids = count(1)


@dataclass
class ClientNames:
    """One connection's share: the live names it uses and those it created."""

    id: int = field(default_factory=lambda: next(_ids))
    used: tuple[set[Name], set[Name], set[Name]] = field(
        default_factory=lambda: (set(), set(), set()))
    created: tuple[set[Name], set[Name], set[Name]] = field(
        default_factory=lambda: (set(), set(), set()))
    next_prune_s: float = -float("inf")  # a flood at its bound rescans ``created`` this seldom


class NameRefusal(NamedTuple):
    records: int  # records refused
    kind: str  # the first bound that was reached: "hosts", "devices" or "processes"
    limit: int
    scope: str  # "live" (all clients), "client" (this connection) or "run" (ever created)

    @property
    def reason(self) -> str:
        """The counter it adds to: ``processes``, ``devices_per_client``, ``hosts_per_run``."""
        return self.kind if self.scope == "live" else f"{self.kind}_per_{self.scope}"


@dataclass
class _Live:
    """One kind's live names: when each was last seen, and which connections hold it."""

    seen: dict[Name, float] = field(default_factory=dict)
    holders: dict[Name, set[int]] = field(default_factory=dict)
    ever: set[Name] = field(default_factory=set)  # hosts and devices: created this run

    def drop(self, name: Name) -> None:
        self.seen.pop(name, None)
        self.holders.pop(name, None)


class NameLimits:
    def __init__(self, limits: Counts = DEFAULT_LIMITS,
                 client_limits: Counts = CLIENT_LIMITS, *, idle_s: float = DEFAULT_IDLE_S,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        if min(*limits, *client_limits) < 1:
            raise ValueError(f"name limits must be >= 1, got {limits} and {client_limits}")
        if not idle_s > 0:
            raise ValueError(f"agent.name_idle_s must be > 0 s, got {idle_s!r}")
        self.limits, self.client_limits, self.idle_s = limits, client_limits, idle_s
        self._clock = clock
        self._live = (_Live(), _Live(), _Live())
        self._next_sweep_s = [-float("inf")] * 3
        self.refused: Counter[str] = Counter()  # records, by NameRefusal.reason

    @classmethod
    def from_config(cls, config: Mapping[str, Any], clock: Clock = SYSTEM_CLOCK) -> NameLimits:
        return cls(Counts(config["agent.max_hosts"], config["agent.max_devices"],
                          config["agent.max_processes"]), idle_s=config["agent.name_idle_s"],
                   clock=clock)

    @property
    def hosts(self) -> set[Name]:
        return set(self._live[0].seen)

    @property
    def devices(self) -> set[Name]:
        return set(self._live[1].seen)

    @property
    def processes(self) -> set[Name]:
        return set(self._live[2].seen)

    @property
    def counts(self) -> Counts:
        """Live names now (the agent's own host not counted). Read-only: ``status`` calls it
        from other threads (the writer's stats task, ``/metrics``) while ingest admits."""
        now = self._clock.monotonic_s()
        return Counts(*(sum(1 for seen in list(live.seen.values()) if now - seen < self.idle_s)
                        for live in self._live))

    def status(self) -> dict[str, Any]:
        """For ``vramscope status``: live names, their bounds and what was refused."""
        return {"live": self.counts._asdict(), "limits": self.limits._asdict(),
                "idle_s": self.idle_s, "refused": dict(self.refused)}

    def admit(self, records: Sequence[R], client: ClientNames
              ) -> tuple[Sequence[R], NameRefusal | None]:
        """The records whose names are live or may be created, and what was refused."""
        now = self._clock.monotonic_s()
        # inline, not _triple(): this runs on every record of every message
        triples = {(r.host, r.device if r.device_uuid is None else -1, r.pid) for r in records}
        refused: dict[Triple, NameRefusal] = {}
        for triple in (sorted(triples, key=repr) if len(triples) > 1 else triples):
            why = self._admit_triple(triple, client, now)  # sorted: the same names win always
            if why is not None:
                refused[triple] = why
        if not refused:
            return records, None
        kept = []
        for r in records:  # each refused record counted under its own triple's bound
            why = refused.get((r.host, r.device if r.device_uuid is None else -1, r.pid))
            if why is None:
                kept.append(r)
            else:
                self.refused[why.reason] += 1
        first = next(iter(refused.values()))  # the log line names one bound
        return kept, first._replace(records=len(records) - len(kept))

    def release(self, client: ClientNames) -> None:
        """The connection closed: the names only it held free their slots now."""
        for kind, live in enumerate(self._live):
            for name in client.used[kind]:
                holders = live.holders.get(name)
                if holders is not None:
                    holders.discard(client.id)
                    if not holders:
                        live.drop(name)
            client.used[kind].clear()
            client.created[kind].clear()

    def _admit_triple(self, triple: Triple, client: ClientNames,
                      now: float) -> NameRefusal | None:
        """None when every name of ``triple`` is live or was created now; else the bound."""
        host, device, pid = triple
        names = (host, (host, device) if device >= 0 else None,
                 (host, pid) if pid is not None else None)
        new = [kind for kind, name in enumerate(names)
               if name is not None and not self._touch(kind, name, client, now)]
        for kind in new:  # every bound checked before any name is created
            why = self._bound(kind, names[kind], client, now)
            if why is not None:
                return why
        for kind in new:
            self._create(kind, names[kind], client, now)
        return None

    def _touch(self, kind: int, name: Name, client: ClientNames, now: float) -> bool:
        """Mark a live name seen (and held by ``client``); False when it is not live."""
        live = self._live[kind]
        seen = live.seen.get(name)
        if seen is None or now - seen >= self.idle_s:
            return False
        live.seen[name] = now
        if name not in client.used[kind]:
            self._hold(kind, name, client)
        return True

    def _hold(self, kind: int, name: Name, client: ClientNames) -> None:
        live = self._live[kind]
        live.holders.setdefault(name, set()).add(client.id)
        used = client.used[kind]
        used.add(name)
        if len(used) > 2 * self.limits[kind]:  # a long connection's expired names
            used.intersection_update(live.seen)

    def _bound(self, kind: int, name: Name, client: ClientNames,
               now: float) -> NameRefusal | None:
        live = self._live[kind]
        label = Counts._fields[kind]
        if name not in live.seen and len(live.seen) >= self.limits[kind]:
            self._sweep(kind, now)
            if len(live.seen) >= self.limits[kind]:
                return NameRefusal(0, label, self.limits[kind], "live")
        created = client.created[kind]
        if len(created) >= self.client_limits[kind]:
            self._prune(client, now)
            if len(created) >= self.client_limits[kind]:
                return NameRefusal(0, label, self.client_limits[kind], "client")
        ever_max = EVER_FACTOR * self.limits[kind]
        if kind < 2 and name not in live.ever and len(live.ever) >= ever_max:
            return NameRefusal(0, label, ever_max, "run")
        return None

    def _create(self, kind: int, name: Name, client: ClientNames, now: float) -> None:
        live = self._live[kind]
        live.drop(name)  # an expired entry of the same name
        live.seen[name] = now
        if kind < 2:
            live.ever.add(name)
        client.created[kind].add(name)
        client.used[kind].discard(name)  # held afresh below
        self._hold(kind, name, client)

    def _prune(self, client: ClientNames, now: float) -> None:
        """Forget the names ``client`` created that expired (at most once a second)."""
        if now < client.next_prune_s:
            return
        client.next_prune_s = now + _SWEEP_EVERY_S
        for live, created in zip(self._live, client.created, strict=True):
            created.intersection_update(
                [n for n in created if now - live.seen.get(n, -float("inf")) < self.idle_s])

    def _sweep(self, kind: int, now: float) -> None:
        """Free the names silent for ``idle_s`` (at most once a second per kind)."""
        if now < self._next_sweep_s[kind]:
            return
        self._next_sweep_s[kind] = now + _SWEEP_EVERY_S
        live = self._live[kind]
        for name in [n for n, seen in live.seen.items() if now - seen >= self.idle_s]:
            live.drop(name)

    def describe(self, refusal: NameRefusal) -> str:
        if refusal.scope == "client":
            return (f"{refusal.records} record(s) refused: this client already holds "
                    f"{refusal.limit} new {refusal.kind} it created, the most one client may")
        if refusal.scope == "run":
            return (f"{refusal.records} record(s) refused: {refusal.limit} distinct "
                    f"{refusal.kind} were created since the agent started, the most one run "
                    f"may ({EVER_FACTOR} x agent.max_{refusal.kind}; they are rows every page "
                    f"reads)")
        return (f"{refusal.records} record(s) refused: {refusal.limit} {refusal.kind} are live "
                f"already (each sent in the last {self.idle_s:g} s by an open connection), the "
                f"most clients may keep (agent.max_{refusal.kind}, agent.name_idle_s)")

