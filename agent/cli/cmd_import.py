"""``vramscope import FILE... [--db URL] [--skip-invalid]``: load trace-format-v1 files.

Strict by default: the first malformed line of any file rejects the import with
``FILE:LINE: what is wrong`` and writes nothing. All the files given are imported in **one**
transaction: if any of them fails (a bad line, a write the database refuses), none is kept.
Files are streamed in chunks of 5,000 records, so memory does not grow with their size.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from vramscope.agent.cli.common import (
    add_config_flag,
    add_db_flag,
    config_from_args,
    open_store,
    shown_db,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from vramscope.agent.alerts.engine import AlertEngine
    from vramscope.agent.errors import TraceError
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
    from vramscope.agent.alerts.engine import AlertEngine

    config = config_from_args(args)
    # the engine runs over what is imported and its verdicts are stored with it, so that the
    # pages and ``analyze --db`` show the answers ``analyze FILE`` gives (one answer)
    engine = AlertEngine.from_config(config)
    engine.verdicts.keep = False
    with open_store(args, config) as store, store.transaction() as conn:
        reports = [_import_file(store, conn, path, args.skip_invalid, engine)
                   for path in args.files]
    for report in reports:  # printed once everything is committed
        print(report)
    # said always: without --db the file is the config's database.url (by default under the
    # data directory), which a newcomer would not know to look for
    where = "" if args.db_url else " (database.url of the config; --db PATH to choose)"
    print(f"written to {shown_db(store.safe_url)}{where}")
    return 0



def _import_file(store: Store, conn: Connection, path: str, skip_invalid: bool,
                 engine: AlertEngine) -> str:
    from vramscope.agent.store import verdicts
    from vramscope.agent.trace import iter_trace

    skipped: list[TraceError] = []
    n_samples = n_events = 0
    for samples, events in iter_trace(path, skip_invalid=skip_invalid, skipped=skipped):
        store.write(samples, events, conn=conn)
        engine.feed_batch(samples, events)
        verdicts.write(store, engine.verdicts.take(), conn)
        n_samples += len(samples)
        n_events += len(events)
    report_skipped(skipped)
    return f"{path}: imported {n_samples} samples and {n_events} events{skipped_note(skipped)}"


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
