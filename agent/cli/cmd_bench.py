"""``vramscope bench [NAMES...] [--json] [--quick]``.

A benchmark that cannot run here (a ``VramscopeError``) is listed under ``skipped``, one that
fails under ``errors`` with its traceback; the others still run, and the exit status is 1 when
any failed. The benchmarks live in ``tools/bench/`` of the source checkout, outside the wheel:
an installed wheel has none, and ``vramscope bench`` says so (exit 2).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from pathlib import Path
from types import ModuleType

from vramscope.agent.cli.common import url_or_path
from vramscope.agent.errors import UsageError, VramscopeError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # The names are not listed here: building the parser (every command) must not import the
    # checkout's tools; an unknown NAME's error lists them.
    p = sub.add_parser("bench", help="run benchmarks (ratios against same-run baselines)",
                       description="Run benchmarks, from a source checkout (tools/bench/). "
                                   "Default: all; an unknown NAME lists the known ones.")
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


def bench_package() -> ModuleType:
    """``tools.bench`` of the source checkout this package runs from; a usage error (exit 2)
    where there is none (an installed wheel)."""
    import vramscope.agent

    checkout = Path(vramscope.agent.__file__).resolve().parent.parent  # agent/ -> the checkout
    if not (checkout / "tools" / "bench" / "__init__.py").is_file():
        raise UsageError("vramscope bench runs from a source checkout (git clone, then "
                         "pip install -e .): this installation has no tools/bench/")
    if str(checkout) not in sys.path:
        sys.path.append(str(checkout))  # last: the checkout's folders shadow nothing installed
    bench = importlib.import_module("tools.bench")
    if not Path(bench.__file__ or "").resolve().is_relative_to(checkout):
        raise VramscopeError(f"another package named tools is imported ({bench.__file__}), "
                             f"not the checkout's {checkout / 'tools'}")
    return bench


def run(args: argparse.Namespace) -> int:
    bench = bench_package()
    known: dict[str, tuple[str, str]] = bench.BENCHMARKS
    names = args.names or list(known)
    for name in names:
        if name not in known:
            raise UsageError(f"unknown benchmark {name!r}; known: {', '.join(known)}")
    if args.rounds is not None and args.rounds < 1:
        raise UsageError(f"--rounds must be at least 1, not {args.rounds}")
    extra = {"nodes": args.nodes, "devices": args.devices, "duration_s": args.duration}
    options = bench.BenchOptions(quick=args.quick, db_url=args.db_url, rounds=args.rounds,
                                 extra={k: v for k, v in extra.items() if v is not None})
    figures, failures, errors = [], [], []
    for name in names:
        try:
            got = bench.load(name).run(options)
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
