"""``vramscope bench [NAMES...] [--json] [--quick]``."""

from __future__ import annotations

import argparse
import json
import sys

from vramscope.agent.errors import UsageError, VramscopeError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from vramscope.agent.bench import BENCHMARKS

    names = ", ".join(BENCHMARKS)
    p = sub.add_parser("bench", help="run benchmarks (ratios against same-run baselines)",
                       description=f"Run benchmarks. Known: {names}. Default: all.")
    p.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    p.add_argument("--json", action="store_true", help="print figures as stable JSON")
    p.add_argument("--quick", action="store_true", help="smaller sizes (for smoke tests)")
    p.add_argument("--db", dest="db_url", help="database URL where a benchmark needs one")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vramscope.agent.bench import BENCHMARKS, BenchOptions, load

    names = args.names or list(BENCHMARKS)
    for name in names:
        if name not in BENCHMARKS:
            raise UsageError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    options = BenchOptions(quick=args.quick, db_url=args.db_url)
    figures, failures = [], []
    for name in names:
        module = load(name)
        try:
            got = module.run(options)
        except VramscopeError as exc:
            failures.append({"bench": name, "error": str(exc)})
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
                   "skipped": failures}, sys.stdout, indent=2)
        print()
    else:
        for f in failures:
            print(f"{f['bench']:10} skipped: {f['error']}")
    return 0
