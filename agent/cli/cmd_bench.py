"""``vramscope bench [NAMES...] [--json] [--quick]``.

A benchmark that cannot run here (a ``VramscopeError``: no GPU, no vLLM) is listed under
``skipped``; one that fails (any other exception) under ``errors`` with its traceback, and the
others still run and report: one broken benchmark never voids the whole JSON. The exit status
is 1 when any failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from vramscope.agent.cli.common import url_or_path
from vramscope.agent.errors import UsageError, VramscopeError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from vramscope.agent.bench import BENCHMARKS

    names = ", ".join(BENCHMARKS)
    p = sub.add_parser("bench", help="run benchmarks (ratios against same-run baselines)",
                       description=f"Run benchmarks. Known: {names}. Default: all.")
    p.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    p.add_argument("--json", action="store_true", help="print figures as stable JSON")
    p.add_argument("--quick", action="store_true", help="smaller sizes (for smoke tests)")
    p.add_argument("--db", dest="db_url", type=url_or_path,
                   help="database URL or SQLite file path where a benchmark needs one")
    p.add_argument("--rounds", type=int, metavar="N",
                   help="rounds of each measurement (default: each benchmark's own, 3 or 5; "
                        "1 for a long store, spread then reads 'over 1 rounds')")
    fleet = p.add_argument_group("bench fleet", "the simulated fleet's size (default 64 nodes "
                                 "x 8 devices for 1800 s; --quick: 3 x 2 for 40 s)")
    fleet.add_argument("--nodes", type=int, metavar="N", help="nodes, each a real agent")
    fleet.add_argument("--devices", type=int, metavar="N", help="simulated devices per node")
    fleet.add_argument("--duration", type=float, metavar="S",
                       help="seconds of record time (run in real time)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vramscope.agent.bench import BENCHMARKS, BenchOptions, load

    names = args.names or list(BENCHMARKS)
    for name in names:
        if name not in BENCHMARKS:
            raise UsageError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    if args.rounds is not None and args.rounds < 1:
        raise UsageError(f"--rounds must be at least 1, not {args.rounds}")
    extra = {"nodes": args.nodes, "devices": args.devices, "duration_s": args.duration}
    options = BenchOptions(quick=args.quick, db_url=args.db_url, rounds=args.rounds,
                           extra={k: v for k, v in extra.items() if v is not None})
    figures, failures, errors = [], [], []
    for name in names:
        try:
            got = load(name).run(options)
        except VramscopeError as exc:  # a benchmark that cannot run here (no GPU, no vLLM)
            failures.append({"bench": name, "error": str(exc)})
            continue
        except Exception as exc:  # noqa: BLE001 - one broken benchmark must not void the rest
            errors.append({"bench": name, "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc(limit=8)})
            continue
        figures.extend(got)
        if not args.json:
            for f in got:
                mark = {True: "met", False: "MISSED", None: ""}[f.met]
                print(f"{f.bench:10} {f.metric:42} {f.value:>14.6g} {f.unit:10} "
                      f"{f.target:>12} {mark:6} {f.spread}")
            sys.stdout.flush()
    if args.json:
        json.dump({"format": "vramscope.bench/1", "figures": [f.to_json() for f in figures],
                   "skipped": failures, "errors": errors}, sys.stdout, indent=2)
        print()
    else:
        for f in failures:
            print(f"{f['bench']:10} skipped: {f['error']}")
        for f in errors:
            print(f"{f['bench']:10} FAILED: {f['error']}\n{f['traceback']}", file=sys.stderr)
    return 1 if errors else 0
