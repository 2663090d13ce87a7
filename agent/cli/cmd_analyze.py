"""``vramscope analyze FILE... | --db URL [--since TS] [--until TS] [--json] [--config PATH]
[--device N] [--makeup]``.

The same analysis and alert rules as the live agent over trace files or the store, as a report
or ``--json``'s ``vramscope.analysis/1`` document (docs/analysis.md). Records stream through
the analysis, so memory is bounded whatever the window (docs/analysis.md, "Memory"); trace files
are sorted within ``FILE_SLACK_S``, and one further out of time order is loaded whole.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from vramscope.agent.cli import progress
from vramscope.agent.cli.common import (
    add_config_flag,
    config_from_args,
    open_store,
    shown_db,
    url_or_path,
)
from vramscope.agent.cli.measured import Measured
from vramscope.agent.errors import UsageError, VramscopeError

if TYPE_CHECKING:
    from vramscope.agent.cli.progress import Progress
    from vramscope.agent.config import Config
    from vramscope.agent.errors import TraceError
    from vramscope.agent.records import Event, PostMortem, Sample
    from vramscope.agent.second_core import Batch
    from vramscope.agent.store import Store
    from vramscope.agent.trace import OnRead


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("analyze", help="leaks, OOM risk, fragmentation and alerts of a recording",
                       description="Analyze trace files or the database: leak detection, OOM "
                                   "risk (causal), fragmentation, phases, KV pool, alerts.")
    p.add_argument("files", nargs="*", metavar="FILE", help="trace v1 files (JSON Lines)")
    p.add_argument("--db", metavar="URL", dest="db_url", type=url_or_path,
                   help="analyze the database at URL (or a SQLite file's path) instead of "
                        "files")
    p.add_argument("--json", action="store_true",
                   help="print the vramscope.analysis/1 JSON document")
    p.add_argument("--device", type=int, metavar="N", help="only this device index")
    p.add_argument("--since", type=float, metavar="TS",
                   help="with --db: from this Unix time (s)")
    p.add_argument("--until", type=float, metavar="TS",
                   help="with --db: up to this Unix time (s)")
    p.add_argument("--skip-invalid", action="store_true",
                   help="analyze the good lines of trace files: report the bad ones, and read a "
                        "damaged (truncated) gzip file up to the damage")
    p.add_argument("--makeup", action="store_true",
                   help="diff the idle-point allocator layouts (memory_layout events) and show "
                        "what the growth is made of, with or without a detected leak")
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vramscope.agent.alerts.config_check import document_lines
    from vramscope.agent.analysis.report_text import render_text

    if bool(args.files) == bool(args.db_url):
        raise UsageError("give trace FILEs or --db URL (one of the two)")
    if (args.since is not None or args.until is not None) and not args.db_url:
        raise UsageError("--since and --until need --db (a trace file is analyzed whole)")
    if args.skip_invalid and args.db_url:
        raise UsageError("--skip-invalid is for trace files (a database holds no invalid lines)")
    config = config_from_args(args)
    measured = Measured()
    if args.db_url:
        doc, postmortems = _analyze_db(config, args, measured)
    else:
        doc, postmortems = _analyze_files(args.files, config, args, measured), []
    if not doc["devices"]:
        raise VramscopeError(_nothing_to_analyze(args))
    if args.json:
        json.dump(doc, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    else:
        for dev, d in doc["devices"].items():  # the text only: the document is a contract
            d["oom"]["unjudged"] = measured.unjudged(int(dev))
        sys.stdout.write(render_text(doc) + document_lines(doc))
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


# A trace written in time order give or take this much (the hooks' and the agent's writers put
# a record down moments after its time; a thread's record may follow a later one) is analyzed as
# a stream, in bounded memory; one out of order by more is loaded whole and sorted.
FILE_SLACK_S = 60.0


def _nothing_to_analyze(args: argparse.Namespace) -> str:
    which = "" if args.device is None else f" of device {args.device}"
    if args.db_url:
        window = "" if args.since is None and args.until is None else " in the window asked for"
        return f"{shown_db(args.db_url)}: no records{which}{window}: nothing to analyze"
    return f"{', '.join(args.files)}: no records{which}: nothing to analyze"


def _check_not_empty(paths: list[str], counts: list[int], skip_invalid: bool) -> None:
    """An empty trace file is an error, not an all-clear report."""
    for path, n in zip(paths, counts):
        if not n:
            why = "no valid records" if skip_invalid else "no records (an empty file)"
            raise VramscopeError(f"{path}: {why}: nothing to analyze")


def _counted(chunks: Iterator[tuple[list[Sample], list[Event]]], counts: list[int], i: int
             ) -> Iterator[tuple[list[Sample], list[Event]]]:
    for samples, events in chunks:
        counts[i] += len(samples) + len(events)
        yield samples, events


def _analyze_files(paths: list[str], config: Config, args: argparse.Namespace,
                   measured: Measured) -> dict[str, Any]:
    """Trace files as one stream in time order (each file sorted within ``FILE_SLACK_S``, the
    files merged), through the analysis and dropped, as ``--db`` does: the same document as
    loading them whole (the same order: events first on a tie, then each file in turn), in
    the memory of a minute of records. Read a second time, up to its OOM, for a device that
    had one. A file further out of order is loaded whole instead, with a note on stderr.

    Large files are decoded here and analyzed on a second core (second_core.py): the same
    function over the same batches."""
    from vramscope.agent import second_core
    from vramscope.agent.alerts.offline import CHUNK, analyze_records
    from vramscope.agent.analysis.merge import OutOfOrder, record_batches
    from vramscope.agent.cli.cmd_import import report_skipped
    from vramscope.agent.trace import read_trace

    skipped: list[TraceError] = []
    counts = [0] * len(paths)  # how many records each file held
    analyze = partial(_analyze_batches, paths, args.skip_invalid, config, args.makeup)
    try:
        with _reading(paths, args) as shown:
            records = file_records(paths, args.skip_invalid, skipped, counts, args.device,
                                   on_read=shown.advance)
            doc = second_core.consume(analyze, record_batches(measured.watch(records), CHUNK),
                                      in_child=second_core.worth_a_child(paths))
        report_skipped(skipped)
        _check_not_empty(paths, counts, args.skip_invalid)
        return doc
    except OutOfOrder as exc:
        sys.stderr.write(f"note: {exc}: loading the recording whole to sort it\n")
    samples: list[Sample] = []
    events: list[Event] = []
    with _reading(paths, args) as shown:
        for path in paths:
            trace = read_trace(path, skip_invalid=args.skip_invalid, on_read=shown.advance)
            if trace.skipped:
                shown.clear()  # the skipped lines below it, not through it
            report_skipped(trace.skipped)
            _check_not_empty([path], [len(trace.samples) + len(trace.events)],
                             args.skip_invalid)
            samples += measured.watch(trace.samples)
            events += trace.events
        shown.stage("analyzing")
        return analyze_records(samples, events, config, device=args.device,
                               makeup=args.makeup)


def _reading(paths: list[str], args: argparse.Namespace) -> Progress:
    """The progress of reading the files, in bytes: on a terminal, and not with ``--json``."""
    return progress.shown("analyze", progress.BYTES, progress.file_sizes(paths), verb="read",
                          quiet=args.json)


def file_records(paths: list[str], skip_invalid: bool, skipped: list[TraceError],
                  counts: list[int], device: int | None, until_s: float = math.inf, *,
                  on_read: OnRead | None = None) -> Iterator[Sample | Event]:
    """The files' records (of ``device``, or all) in time order up to ``until_s``; the bad
    lines go to ``skipped``, each file's record count to ``counts``, the bytes read to
    ``on_read``."""
    import heapq

    from vramscope.agent.analysis.merge import in_time_order
    from vramscope.agent.trace import iter_trace

    streams = [in_time_order(_counted(iter_trace(path, skip_invalid=skip_invalid,
                                                 skipped=skipped, on_read=on_read), counts, i),
                             FILE_SLACK_S, i, path)
               for i, path in enumerate(paths)]
    for ts_s, _kind, _source, _seq, r in heapq.merge(*streams):
        if ts_s > until_s:
            return
        if device is None or r.device == device:
            yield r


def _analyze_batches(paths: list[str], skip_invalid: bool, config: Config, makeup: bool,
                     batches: Iterable[Batch]) -> dict[str, Any]:
    """The document of the files' batches (module level: it may run in a child process),
    reading the files again, up to its OOM, for a device that had one."""
    from vramscope.agent.alerts.offline import analyze_stream

    def reopen(device: int, until_s: float) -> Iterator[Sample | Event]:
        return file_records(paths, skip_invalid, [], [0] * len(paths), device, until_s)

    return analyze_stream(batches, reopen, config, makeup=makeup)


def _analyze_db(config: Config, args: argparse.Namespace, measured: Measured
                ) -> tuple[dict[str, Any], list[PostMortem]]:
    """Each device's window analyzed on its own (the alert rules are per device), the
    documents joined. A device's samples stream from the store in batches, each with the events
    up to its last sample (``time_batches``), through the engine and the summaries, and are
    dropped (``analyze_stream``): memory does not grow with the window. A device with an OOM
    is read a second time, up to it, for the diagnosis."""
    from vramscope.agent.alerts.offline import CHUNK, analyze_stream
    from vramscope.agent.analysis.merge import iter_merged, time_batches
    from vramscope.agent.analysis.report import FORMAT
    from vramscope.agent.store import verdicts as stored_verdicts
    from vramscope.agent.store import window_verdicts

    doc: dict[str, Any] = {"format": FORMAT, "devices": {}, "alerts": []}
    postmortems: list[PostMortem] = []
    with open_store(args, config, reading="analyze") as store:

        def records(dev: int, until_s: float) -> Iterator[Sample | Event]:
            end = _earlier(until_s, args.until)
            return iter_merged(store.iter_samples(dev, args.since, end),
                               store.iter_events(dev, args.since, end))

        indexes = sorted({d["device_index"] for d in store.devices()})
        for dev in [i for i in indexes if args.device in (None, i)]:
            mine = [pm for _, pm in store.postmortems(dev) if _within(pm.ts_s, args)]
            batches = time_batches(measured.watch(store.iter_samples(dev, args.since,
                                                                     args.until)),
                                   store.iter_events(dev, args.since, args.until), CHUNK)
            part = analyze_stream(batches, records, config, postmortems=mine,
                                  makeup=args.makeup)
            if stored_verdicts.has_any(store, dev):
                # the verdicts the engine stored as it saw every record (the agent, import):
                # the answer every page shows, not a replay of what retention left
                since = -math.inf if args.since is None else args.since
                window_verdicts.attach_stored(part, store, dev, None, since,
                                              _earlier(math.inf, args.until))
                doc["verdicts_from"] = "store"
            else:
                _note_tiers(store, dev, args.since, args.until)
            doc["devices"].update(part["devices"])
            doc["alerts"] += part["alerts"]
            postmortems += mine
    doc["alerts"].sort(key=lambda a: a["fired_ts"])  # stable: devices in order on a tie
    return doc, postmortems


def _note_tiers(store: Store, device: int, since: float | None, until: float | None) -> None:
    """Say on stderr (the document stays the contract) when the window reaches back before the
    device's raw samples: retention keeps that part only in the per-second tier and the minute
    rollups, which the dashboard reads and analyze, which replays raw samples, does not."""
    from vramscope.agent.store.reader import raw_from
    from vramscope.agent.timefmt import iso_utc

    span = store.time_range(device)
    first_raw = raw_from(store, device)
    if span is None or (first_raw is not None and span[0] >= first_raw):
        return  # nothing older than the raw samples is kept
    start = span[0] if since is None else max(since, span[0])
    if (first_raw is not None and start >= first_raw) or (until is not None and until < start):
        return
    kept = "no raw samples" if first_raw is None else f"raw samples from {iso_utc(first_raw)}"
    sys.stderr.write(
        f"note: device {device}: {kept}; from {iso_utc(start)} the store keeps only the "
        "per-second tier and minute rollups (retention.raw_s), which analyze does not replay: "
        "the dashboard's Leaks and OOM risk pages read them\n")


def _earlier(a: float, b: float | None) -> float:
    return a if b is None else min(a, b)


def _within(ts_s: float, args: argparse.Namespace) -> bool:
    return ((args.since is None or ts_s >= args.since)
            and (args.until is None or ts_s <= args.until))
