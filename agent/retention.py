"""Retention: per-minute rollups, then deletion of raw rows past ``retention.raw_s``.

Each :meth:`Retention.step` does a small, bounded piece of work — roll up at most
``minutes_per_step`` minutes, delete at most ``retention.step_rows`` rows per table — and is run
by the writer thread between batches, so retention never stalls ingest (and SQLite still sees
one writer).

Rollups: per device, per minute, per source and metric (every ``*_bytes`` / counter field of
a sample): min, max, mean, last and count, in the ``rollups`` table. A minute is rolled up once
it is ``grace_s`` old; the watermark is the newest rolled-up minute, so after a restart work
resumes where it stopped. Raw samples are deleted only once they are both older than
``raw_s`` and rolled up. Samples that arrive for a minute already rolled up (a trace replayed
with old timestamps) are kept raw but miss the rollups; see docs/agent.md.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from agent.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("vramscope.retention")

BUCKET_S = 60.0


class StepResult(NamedTuple):
    rolled_up_minutes: int
    rollup_rows: int
    deleted: dict[str, int]

    @property
    def busy(self) -> bool:
        """True when there was work: the caller may run the next step sooner."""
        return bool(self.rolled_up_minutes or any(self.deleted.values()))


class Retention:
    def __init__(self, *, raw_s: float, rollup_s: float, step_rows: int,
                 clock: Clock = SYSTEM_CLOCK, grace_s: float = 120.0,
                 minutes_per_step: int = 2) -> None:
        if raw_s <= 0 or rollup_s <= 0 or step_rows < 1 or minutes_per_step < 1:
            raise ValueError(f"bad retention settings: raw_s={raw_s}, rollup_s={rollup_s}, "
                             f"step_rows={step_rows}, minutes_per_step={minutes_per_step}")
        self.raw_s = raw_s
        self.rollup_s = rollup_s
        self.step_rows = step_rows
        self.grace_s = grace_s
        self.minutes_per_step = minutes_per_step
        self._clock = clock

    @classmethod
    def from_config(cls, config: Any, clock: Clock = SYSTEM_CLOCK) -> Retention:
        return cls(raw_s=config["retention.raw_s"], rollup_s=config["retention.rollup_s"],
                   step_rows=config["retention.step_rows"], clock=clock)

    def step(self, store: Any) -> StepResult:
        """One bounded step: roll up a few minutes, then delete a few old rows."""
        from agent.store import retention_sql as sql

        now_s = self._clock.time_s()
        minutes, rows = self._rollup(store, sql, now_s)
        watermark = sql.rollup_watermark(store)
        raw_cutoff = now_s - self.raw_s
        if watermark is not None:
            raw_cutoff = min(raw_cutoff, watermark)
        deleted = {
            "samples": sql.delete_older(store, "samples", raw_cutoff, self.step_rows)
            if watermark is not None else 0,
            "events": sql.delete_older(store, "events", now_s - self.raw_s, self.step_rows),
            "agent_stats": sql.delete_older(store, "agent_stats", now_s - self.raw_s,
                                            self.step_rows),
            "rollups": sql.delete_rollups_older(store, now_s - self.rollup_s,
                                                self.minutes_per_step),
        }
        return StepResult(minutes, rows, deleted)

    def _rollup(self, store: Any, sql: Any, now_s: float) -> tuple[int, int]:
        """Roll up the minutes after the watermark, skipping any gap without samples."""
        first = sql.first_sample_ts(store, sql.rollup_watermark(store))
        if first is None:
            return 0, 0
        start = _floor_minute(first)
        end = min(_floor_minute(now_s - self.grace_s), start + self.minutes_per_step * BUCKET_S)
        if end <= start:
            return 0, 0
        rows = sql.rollup_window(store, start, end)
        return int((end - start) // BUCKET_S), rows


def _floor_minute(ts_s: float) -> float:
    return (ts_s // BUCKET_S) * BUCKET_S
