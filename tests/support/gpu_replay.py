"""A committed GPU recording (an agent's gzipped SQLite database) replayed through an alert
engine in one-second batches, as the agent's writer feeds it."""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from vramscope.agent.alerts.engine import AlertChange, AlertEngine
from vramscope.agent.cli import main
from vramscope.agent.records import Event, Sample
from vramscope.agent.trace import read_trace


def unpacked(db_gz: Path, tmp: Path) -> Path:
    """The recording's database, unpacked into ``tmp``."""
    db = tmp / "run.db"
    with gzip.open(db_gz) as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return db


def records(db: Path, tmp: Path) -> list[Sample | Event]:
    """Its samples and events in time order, through `vramscope export` (as a user reads it)."""
    assert main(["export", "--db", str(db), "-o", str(tmp / "run.jsonl")]) == 0
    trace = read_trace(str(tmp / "run.jsonl"))
    return sorted([*trace.samples, *trace.events], key=lambda r: r.ts_s)


def batches(recs: list[Sample | Event]) -> Iterator[list[Sample | Event]]:
    """A batch a second."""
    i = 0
    while i < len(recs):
        j, end = i, recs[i].ts_s + 1.0
        while j < len(recs) and recs[j].ts_s < end:
            j += 1
        yield recs[i:j]
        i = j


def replay(engine: AlertEngine, recs: list[Sample | Event],
           after_batch: Callable[[float], None] | None = None) -> list[AlertChange]:
    """Every change the engine made; ``after_batch(last_ts)`` after each batch."""
    changes: list[AlertChange] = []
    for batch in batches(recs):
        changes += engine.feed(batch)
        if after_batch is not None:
            after_batch(batch[-1].ts_s)
    return changes
