"""``vramscope export [trace] [--device N] [--since TS] [--until TS] [-o FILE]`` writes trace v1;
``vramscope export prometheus-rules`` writes the config's alert rules for Prometheus."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

from vramscope.agent.cli import progress
from vramscope.agent.cli.common import add_config_flag, add_db_flag, config_from_args, open_store
from vramscope.agent.errors import VramscopeError

if TYPE_CHECKING:
    from vramscope.agent.cli.progress import Progress
    from vramscope.agent.store import Store
    from vramscope.agent.trace import OnWritten


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="export a trace (v1) or Prometheus alerting rules")
    p.add_argument("what", nargs="?", default="trace", choices=("trace", "prometheus-rules"),
                   help="what to export (default: trace)")
    p.add_argument("--device", type=int, help="only this device index")
    p.add_argument("--since", type=float, metavar="TS", help="from this Unix time (s)")
    p.add_argument("--until", type=float, metavar="TS", help="up to this Unix time (s)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    add_db_flag(p)
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.what == "prometheus-rules":
        return _export_rules(args)
    from vramscope.agent.trace import write_sorted_trace

    with open_store(args, reading="export") as store, _output(args.output) as out:
        # both cursors in time order, merged as they are read: a week exports in the memory
        # of a few thousand rows
        samples = store.iter_samples(args.device, args.since, args.until)
        events = store.iter_events(args.device, args.since, args.until)
        with progress.shown("export", "records", verb="written", output=out) as shown:
            n = write_sorted_trace(out, samples, events,
                                   on_written=_by_time(shown, _last_ts(store, args)))
    if args.output:
        print(f"{args.output}: wrote {n} lines", file=sys.stderr)
    return 0


def _last_ts(store: Store, args: argparse.Namespace) -> float | None:
    """Where the export ends: ``--until``, or the last sample (two index seeks where a count
    of the rows would read them all)."""
    until: float | None = args.until
    span = store.time_range(args.device)
    if span is None:
        return until
    return span[1] if until is None else min(until, span[1])


def _by_time(shown: Progress, end_s: float | None) -> OnWritten:
    """How far the export is, by time: lines come in time order, from the first one written
    to ``end_s`` (the rows are not counted beforehand)."""
    first_s: float | None = None

    def on_written(lines: int, ts_s: float) -> None:
        nonlocal first_s
        first_s = ts_s if first_s is None else first_s
        span = None if end_s is None else end_s - first_s
        shown.advance(lines, fraction=(ts_s - first_s) / span if span else None)

    return on_written


def _export_rules(args: argparse.Namespace) -> int:
    from vramscope.agent.alerts.prom_rules import render_rules

    text = render_rules(config_from_args(args))  # before opening -o: an error keeps the file
    with _output(args.output) as out:
        out.write(text)
    return 0


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[IO[str]]:
    if path is None:
        yield sys.stdout
        return
    try:
        with open(path, "w", encoding="utf-8") as fh:
            yield fh
    except OSError as exc:
        raise VramscopeError(f"{path}: cannot write: {exc.strerror}") from None
