"""``vramscope analyze FILE... | --db URL [--json] [--config PATH] [--device N] [--makeup]``.

Reads trace files (v1, strict) or the store, runs the same analysis and alert rules as the live
agent, and prints a readable report, or with ``--json`` exactly the ``vramscope.analysis/1``
document (docs/analysis.md). A detected leak comes with its make-up (``leak.makeup``: what the
growth between two idle points is made of, from the ``memory_layout`` events); ``--makeup`` computes
it without a leak too, and says so when the recording has no two layouts to compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from vramscope.agent.cli.common import (
    add_config_flag,
    config_from_args,
    require_existing_database,
)
from vramscope.agent.errors import UsageError

if TYPE_CHECKING:
    from vramscope.agent.config import Config
    from vramscope.agent.records import Event, PostMortem, Sample


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("analyze", help="leaks, OOM risk, fragmentation and alerts of a recording",
                       description="Analyze trace files or the database: leak detection, OOM "
                                   "risk (causal), fragmentation, phases, KV pool, alerts.")
    p.add_argument("files", nargs="*", metavar="FILE", help="trace v1 files (JSON Lines)")
    p.add_argument("--db", metavar="URL", dest="db_url",
                   help="analyze the database at URL instead of files")
    p.add_argument("--json", action="store_true",
                   help="print the vramscope.analysis/1 JSON document")
    p.add_argument("--device", type=int, metavar="N", help="only this device index")
    p.add_argument("--makeup", action="store_true",
                   help="diff the idle-point allocator layouts (memory_layout events) and show "
                        "what the growth is made of, with or without a detected leak")
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vramscope.agent.alerts.offline import analyze_records
    from vramscope.agent.analysis.report import render_text

    if bool(args.files) == bool(args.db_url):
        raise UsageError("give trace FILEs or --db URL (one of the two)")
    config = config_from_args(args)
    samples, events, postmortems = (_from_db(config, args.device) if args.db_url
                                    else _from_files(args.files))
    doc = analyze_records(samples, events, config, postmortems=postmortems, device=args.device,
                          makeup=args.makeup)
    if args.json:
        json.dump(doc, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(doc))
    if args.makeup and not args.json:
        for dev, d in doc["devices"].items():
            if d["leak"]["makeup"] is None and not d["leak"]["detected"]:
                sys.stdout.write(f"device {dev}: no make-up: the recording has fewer than two "
                                 "memory_layout events (idle-point layouts; install() takes "
                                 "them where torch sees a GPU)\n")
    if not args.json:
        sys.stdout.write(postmortem_lines(postmortems, args.device))
    return 0


def postmortem_lines(postmortems: list[PostMortem], device: int | None) -> str:
    """Every stored OOM post-mortem, not only each device's first OOM (the document's)."""
    from vramscope.agent.analysis.diagnosis import complete_postmortem
    from vramscope.agent.timefmt import iso_utc

    mine = [pm for pm in postmortems if device is None or pm.device == device]
    if not mine:
        return ""
    lines = [f"post-mortems: {len(mine)}"]
    for pm in sorted(mine, key=lambda p: (p.device, p.ts_s)):
        failed = ("" if pm.failed_alloc_bytes is None
                  else f", failed allocation {pm.failed_alloc_bytes / 2**20:.1f} MiB")
        lines.append(f"  device {pm.device} at {iso_utc(pm.ts_s)}: likely cause "
                     f"{complete_postmortem(pm).cause}{failed}")
    return "\n".join(lines) + "\n"


def _from_files(paths: list[str]) -> tuple[list[Sample], list[Event], list[PostMortem]]:
    from vramscope.agent.trace import read_trace

    samples: list[Sample] = []
    events: list[Event] = []
    for path in paths:
        trace = read_trace(path)
        samples += trace.samples
        events += trace.events
    return samples, events, []


def _from_db(config: Config, device: int | None
             ) -> tuple[list[Sample], list[Event], list[PostMortem]]:
    from vramscope.agent.store import Store

    require_existing_database(config["database.url"], "analyze")
    with Store.open(config["database.url"], synchronous=config["database.synchronous"],
                    host_name=config["agent.host_name"] or None) as store:
        samples = list(store.iter_samples(device))
        events = store.events(device)
        postmortems = [pm for _, pm in store.postmortems(device)]
    return samples, events, postmortems
