"""Events kept with the rollups, bounded per client process per UTC day.

The write budget bounds a client's rate, but kept events (``agent/event_kinds.py``) live 90 days:
at the budget's rate they would fill the disk. So each client process may have
``agent.client_max_rare_events_per_day`` kept per UTC day (a post-mortem counts as one); beyond,
they are refused one by one (``rejected["rare_events_day"]``). Memory: one entry per process with
a kept event today, cleared each UTC day; past ``max_kept`` the least recently counted goes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any, NamedTuple

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.durations import DAY_S
from vramscope.agent.event_kinds import KEPT_EVENTS
from vramscope.agent.records import Event, Sample

DEFAULT_MAX_PER_DAY = 200_000
REASON = "rare_events_day"
_KEPT = frozenset(KEPT_EVENTS)


class RareRefusal(NamedTuple):
    records: int  # rare events refused
    cap: int


class RareEventsPerDay:
    def __init__(self, max_per_day: int = DEFAULT_MAX_PER_DAY, clock: Clock = SYSTEM_CLOCK,
                 max_kept: int = 4096) -> None:
        if isinstance(max_per_day, bool) or not isinstance(max_per_day, int) or max_per_day < 1:
            raise ValueError(f"agent.client_max_rare_events_per_day must be an integer >= 1, "
                             f"got {max_per_day!r}")
        self.max_per_day = max_per_day
        self._clock = clock
        self._max_kept = max_kept
        self._day: int | None = None
        self._counts: OrderedDict[Hashable, int] = OrderedDict()  # least recently counted first

    @classmethod
    def from_config(cls, config: Mapping[str, Any], clock: Clock = SYSTEM_CLOCK
                    ) -> RareEventsPerDay:
        return cls(config["agent.client_max_rare_events_per_day"], clock)

    def admit(self, process: Hashable, records: list[Sample | Event]
              ) -> tuple[list[Sample | Event], RareRefusal | None]:
        """``records`` less the kept events beyond ``process``'s count for today (the first
        ones are kept, in order); samples and cheap events always pass."""
        rare = sum(1 for r in records if isinstance(r, Event) and r.name in _KEPT)
        if not rare:
            return records, None
        room = self.take(process, rare)
        if rare <= room:
            return records, None
        kept: list[Sample | Event] = []
        for r in records:
            if isinstance(r, Event) and r.name in _KEPT:
                if room <= 0:
                    continue
                room -= 1
            kept.append(r)
        return kept, RareRefusal(len(records) - len(kept), self.max_per_day)

    def take(self, process: Hashable, wanted: int) -> int:
        """How many of ``wanted`` events ``process`` may still have kept today; those are
        counted. A post-mortem is one (the store keeps them longer still)."""
        day = int(self._clock.time_s() // DAY_S)
        if day != self._day:  # a new UTC day: every count starts again
            self._day = day
            self._counts.clear()
        used = self._counts.pop(process, 0)
        granted = min(wanted, max(0, self.max_per_day - used))
        self._counts[process] = used + granted
        if len(self._counts) > self._max_kept:
            self._counts.popitem(last=False)
        return granted

    def describe(self, refusal: RareRefusal) -> str:
        return (f"{refusal.records} event(s) refused: the client had {refusal.cap} events kept "
                f"with the rollups today (UTC), its cap (agent.client_max_rare_events_per_day); "
                f"its samples and frequent events are still stored (a post-mortem counts as one)")

    def __len__(self) -> int:
        return len(self._counts)
