"""The window of record times the live agent accepts: from ``max_age_s`` before its clock to
``max_ahead_s`` after it.

A record older than the raw retention is deleted as soon as it lands; one from the future is
never deleted and hides the newest real sample from the freshness check. Such records are refused
one by one and counted (``rejected["ts"]``); the rest of their message is kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any, NamedTuple, TypeVar

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.timefmt import iso_utc

DEFAULT_AHEAD_S = 300.0
_TS = attrgetter("ts_s")
R = TypeVar("R")


class Refused(NamedTuple):
    records: int
    oldest_s: float  # the extreme times refused, for the log line
    newest_s: float


class TimeWindow:
    def __init__(self, max_age_s: float, max_ahead_s: float = DEFAULT_AHEAD_S,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        if not (max_age_s > 0 and max_ahead_s > 0):
            raise ValueError(f"the time window needs max_age_s > 0 and max_ahead_s > 0, got "
                             f"{max_age_s!r} and {max_ahead_s!r}")
        self.max_age_s, self.max_ahead_s, self._clock = max_age_s, max_ahead_s, clock

    @classmethod
    def from_config(cls, config: Mapping[str, Any], clock: Clock = SYSTEM_CLOCK) -> TimeWindow:
        """``agent.max_record_age_s`` (0: ``retention.raw_s``) and
        ``agent.max_record_ahead_s``."""
        age = config["agent.max_record_age_s"] or config["retention.raw_s"]
        return cls(age, config["agent.max_record_ahead_s"], clock)

    def bounds(self) -> tuple[float, float]:
        now = self._clock.time_s()
        return now - self.max_age_s, now + self.max_ahead_s

    def contains(self, ts_s: float) -> bool:
        lo, hi = self.bounds()
        return lo <= ts_s <= hi

    def keep(self, records: Sequence[R]) -> tuple[Sequence[R], Refused | None]:
        """The records inside the window (``records`` itself when all are: the steady state
        costs a ``min`` and a ``max``), and what was refused."""
        if not records:
            return records, None
        lo, hi = self.bounds()
        times = list(map(_TS, records))
        if lo <= min(times) and max(times) <= hi:
            return records, None
        kept = [r for r, t in zip(records, times, strict=True) if lo <= t <= hi]
        out = [t for t in times if not lo <= t <= hi]
        return kept, Refused(len(out), min(out), max(out))

    def describe(self, refused: Refused) -> str:
        """What the log line says about refused records."""
        lo, hi = self.bounds()
        return (f"{refused.records} record(s) timed {iso_utc(refused.oldest_s)} .. "
                f"{iso_utc(refused.newest_s)}, outside the accepted window {iso_utc(lo)} .. "
                f"{iso_utc(hi)} (agent.max_record_age_s, agent.max_record_ahead_s): the "
                f"client's clock is off, or it replays an old trace (use `vramscope replay "
                f"--retime`, or `vramscope import` to keep its times)")
