"""``vramscope import FILE... [--db URL] [--skip-invalid]``: load trace-format-v1 files.

Strict by default: every file is parsed before anything is written, and the first malformed line
of any file rejects the import with ``FILE:LINE: what is wrong`` and writes nothing.
"""

from __future__ import annotations

import argparse
import sys

from vramscope.agent.cli.common import add_config_flag, add_db_flag, open_store


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("import", help="import trace files (trace format v1, JSON Lines)")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--skip-invalid", action="store_true",
                   help="load the good lines and report how many were skipped")
    add_db_flag(p)
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vramscope.agent.trace import read_trace

    traces = [(path, read_trace(path, skip_invalid=args.skip_invalid)) for path in args.files]
    with open_store(args) as store:
        for path, trace in traces:
            store.write(trace.samples, trace.events)
            for problem in trace.skipped[:10]:
                print(f"skipped {problem}", file=sys.stderr)
            skipped = f", skipped {len(trace.skipped)} invalid lines" if trace.skipped else ""
            print(f"{path}: imported {len(trace.samples)} samples and {len(trace.events)} "
                  f"events{skipped}")
    return 0
