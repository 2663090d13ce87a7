"""``vramscope import FILE... [--db URL] [--skip-invalid]``: load trace-format-v1 files.

Strict by default (the first malformed line rejects the import with ``FILE:LINE: what``), all
files in one transaction, streamed in chunks, and idempotent: a record already stored is not
stored again (agent/store/content_keys.py), and the alert engine runs over the new ones alone.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from vramscope.agent.cli import progress
from vramscope.agent.cli.common import (
    add_config_flag,
    add_db_flag,
    config_from_args,
    open_store,
    shown_db,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from vramscope.agent.alerts.engine import AlertChange
    from vramscope.agent.alerts.verdicts import DeviceVerdict, Verdict
    from vramscope.agent.cli.progress import Progress
    from vramscope.agent.errors import TraceError
    from vramscope.agent.second_core import Batch
    from vramscope.agent.store import Store


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("import", help="import trace files (trace format v1, JSON Lines)")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--skip-invalid", action="store_true",
                   help="load the good lines and report how many were skipped")
    add_db_flag(p)
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vramscope.agent import second_core
    from vramscope.agent.alerts.sinks import StoreSink
    from vramscope.agent.store import verdicts

    config = config_from_args(args)
    reports: list[str] = []
    # The engine runs over what is imported and its verdicts and alerts are stored with it, so
    # that the pages and ``analyze --db`` show the answers ``analyze FILE`` gives (one
    # answer). A large import runs it on a second core while this one decodes and writes
    # (second_core.py).
    in_child = second_core.worth_a_child(args.files)
    with (progress.shown("import", progress.BYTES, progress.file_sizes(args.files),
                         verb="read") as shown,
          open_store(args, config) as store, store.transaction() as conn):
        batches = written_batches(store, conn, args.files, args.skip_invalid, reports, shown)
        rows, changes = second_core.consume(partial(engine_answers, config), batches,
                                            in_child=in_child)
        shown.stage("storing verdicts and alerts")
        verdicts.write(store, rows, conn)
        alerts = StoreSink(store)  # the alerts it fired and resolved, as an agent stores them
        for change in changes:
            alerts.write(change, conn)
    for report in reports:  # printed once everything is committed
        print(report)
    # said always: without --db the file is the config's database.url (by default under the
    # data directory), which a newcomer would not know to look for
    where = "" if args.db_url else " (database.url of the config; --db PATH to choose)"
    print(f"written to {shown_db(store.safe_url)}{where}")
    return 0


def engine_answers(config: Mapping[str, Any], batches: Iterable[Batch]
                   ) -> tuple[list[Verdict | DeviceVerdict], list[AlertChange]]:
    """The verdict rows and the alert changes of the alert engine run over ``batches`` (in a
    child process for a large import: a module-level function, so that it can be started by
    name)."""
    from vramscope.agent.alerts.engine import AlertEngine

    engine = AlertEngine.from_config(config)
    engine.verdicts.keep = False
    rows: list[Verdict | DeviceVerdict] = []
    # every change, taken batch by batch: the engine's own history keeps only the newest
    # HISTORY_MAX, and an import of weeks keeps every alert it fired, as an agent would have
    changes: list[AlertChange] = []
    for samples, events in batches:
        changes += engine.feed_batch(samples, events)
        rows += engine.verdicts.take()
    return rows, changes


def written_batches(store: Store, conn: Connection, paths: list[str], skip_invalid: bool,
                    reports: list[str], shown: Progress | None = None) -> Iterator[Batch]:
    """Each file's records in chunks, each written to the store as it is yielded; a line for
    each file in ``reports`` once it is read; the bytes read counted in ``shown``."""
    from vramscope.agent.store.content_keys import FileRepeats
    from vramscope.agent.trace import iter_trace

    on_read = None if shown is None else shown.advance
    for path in paths:
        skipped: list[TraceError] = []
        counts = [0, 0, 0, 0]  # new samples, new events, samples there, events there
        repeats = FileRepeats.new()
        for samples, events in iter_trace(path, skip_invalid=skip_invalid, skipped=skipped,
                                          on_read=on_read):
            new = store.write_new(samples, events, conn, repeats)
            for i, n in enumerate((len(new.samples), len(new.events), new.samples_there,
                                   new.events_there)):
                counts[i] += n
            if new.samples or new.events:
                yield new.samples, new.events
        if shown is not None and skipped:
            shown.clear()  # the skipped lines below it, not through it
        report_skipped(skipped)
        reports.append(f"{path}: imported {counts[0]} samples and {counts[1]} events"
                       f"{skipped_note(skipped)}{already_note(counts[2], counts[3])}")


def already_note(samples: int, events: int) -> str:
    """``; 435 samples and 12 events were already there, not stored again`` (or nothing)."""
    if not samples and not events:
        return ""
    return f"; {samples} samples and {events} events were already there, not stored again"


def report_skipped(skipped: list[TraceError], shown: int = 10) -> None:
    """The first bad lines on stderr, each ``FILE:LINE: what``, and where a file broke off."""
    from vramscope.agent.trace import TraceDamage

    bad = [p for p in skipped if not isinstance(p, TraceDamage)]
    for problem in bad[:shown]:
        print(f"skipped {problem}", file=sys.stderr)
    if len(bad) > shown:
        print(f"skipped {len(bad) - shown} more invalid lines", file=sys.stderr)
    for damage in skipped:
        if isinstance(damage, TraceDamage):
            print(f"damaged {damage}: the lines before it were read, the rest of the file "
                  f"is lost", file=sys.stderr)


def skipped_note(skipped: list[TraceError]) -> str:
    """``, skipped 2 invalid lines; damaged at line 1738, read up to it`` (or nothing)."""
    from vramscope.agent.trace import TraceDamage

    bad = sum(not isinstance(p, TraceDamage) for p in skipped)
    note = f", skipped {bad} invalid lines" if bad else ""
    damage = next((p for p in skipped if isinstance(p, TraceDamage)), None)
    if damage is not None:
        note += f"; damaged at line {damage.line}, read up to it"
    return note
