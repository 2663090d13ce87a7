"""``vramscope export [trace] [--device N] [--since TS] [--until TS] [-o FILE]`` writes trace v1;
``vramscope export prometheus-rules`` writes the config's alert rules for Prometheus."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import IO

from vramscope.agent.cli.common import add_config_flag, add_db_flag, config_from_args, open_store
from vramscope.agent.errors import VramscopeError


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
        n = write_sorted_trace(out, samples, events)
    if args.output:
        print(f"{args.output}: wrote {n} lines", file=sys.stderr)
    return 0


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
