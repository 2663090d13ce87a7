"""``vramscope bench import``: a day of 8 devices at 10 Hz through ``import`` and ``analyze FILE``.

The alert engine runs over everything imported (its verdicts are stored with the records: one
answer) and over everything analyzed; the question is what that costs on a day of a busy host:
6.9 M samples, 8 devices x 10 Hz x 24 h, as :mod:`tools.history_generator`
writes them (``options.quick``: 2 devices for 10 minutes), exported to a trace file as
``vramscope export`` writes it. Each is the real command in a child process, timed wall to
wall, alternating with its engine-off baseline in the same round:

- **import**: ``vramscope import FILE --db`` (a fresh SQLite file each round) against the same
  records written to a fresh store by the same code without the engine (store writes only).
  Target: <= 120 s for the day.
- **analyze FILE**: ``vramscope analyze FILE --json`` against reading the file through the same
  merge in time order without analysing it. Target: <= 120 s for the day.

A file this large is decoded on one core while the engine runs on the other
(:mod:`vramscope.agent.second_core`); the figures say what that gives on the machine they ran on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from tools.bench import BenchOptions, Figure, Timing, rounds_or
from tools.history_generator import History, generate

TARGET_S = 120.0


def run(options: BenchOptions) -> list[Figure]:
    # every sample raw, no tiers or verdicts: the trace holds what a day's recording holds
    history = History(devices=2 if options.quick else 8, hz=10.0,
                      days=10 / 1440 if options.quick else 1.0,
                      rollups=False, verdicts=False, raw_days=None)
    rounds = rounds_or(options, 1 if options.quick else 2)
    with tempfile.TemporaryDirectory(prefix="vramscope-bench-") as workdir:
        trace, samples = _trace(workdir, history)
        imp, imp_off, ana, read = Timing([]), Timing([]), Timing([]), Timing([])
        for i in range(rounds):
            db = os.path.join(workdir, f"import-{i}.db")
            url = f"sqlite:///{db}"
            imp.samples_s.append(_wall("import", ["-m", "vramscope", "import", trace,
                                                  "--db", url]))
            _remove(db)
            imp_off.samples_s.append(_wall("import, engine off", ["-c", _ENGINE_OFF, trace, url]))
            _remove(db)
            ana.samples_s.append(_wall("analyze", ["-m", "vramscope", "analyze", trace,
                                                   "--json"]))
            read.samples_s.append(_wall("reading", ["-c", _READ_ONLY, trace]))
    hours = history.days * 24
    span = f"{hours:g} h" if hours >= 1 else f"{hours * 60:g} min"
    what = f"{history.devices} devices x {history.hz:g} Hz x {span}"
    return [
        *_pair("import", what, samples, imp, imp_off,
               "the same records into a fresh store without the engine (store writes only)",
               options.quick),
        *_pair("analyze FILE", what, samples, ana, read,
               "reading the file through the same time-order merge, without the analysis",
               options.quick),
    ]


_ENGINE_OFF = """
import sys
from vramscope.agent.cli.cmd_import import written_batches
from vramscope.agent.store import Store
with Store.open(sys.argv[2]) as store, store.transaction() as conn:
    for _ in written_batches(store, conn, [sys.argv[1]], False, []):
        pass
"""

_READ_ONLY = """
import sys
from vramscope.agent.cli.cmd_analyze import file_records
for _ in file_records([sys.argv[1]], False, [], [0], None):
    pass
"""


def _trace(workdir: str, history: History) -> tuple[str, int]:
    """The history exported to a trace file; its path and sample count."""
    from vramscope.agent.store import Store
    from vramscope.agent.trace import write_sorted_trace

    path = os.path.join(workdir, "day.jsonl")
    url = f"sqlite:///{os.path.join(workdir, 'source.db')}"
    with Store.open(url, host_name="bench-host") as store:
        generate(store, history)
        samples = store.count("samples")
        with open(path, "w", encoding="utf-8") as out:
            write_sorted_trace(out, store.iter_samples(None), store.iter_events(None))
    _remove(os.path.join(workdir, "source.db"))
    return path, samples


def _wall(what: str, argv: list[str]) -> float:
    """Wall seconds of ``python ARGV`` in a child process (which must succeed)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{what} exited {proc.returncode}: "
                           f"{proc.stderr.decode(errors='replace')[-500:]}")
    return wall


def _remove(path: str) -> None:
    for p in (path, path + "-wal", path + "-shm"):
        if os.path.exists(p):
            os.remove(p)


def _pair(name: str, what: str, samples: int, subject: Timing, baseline: Timing,
          baseline_text: str, quick: bool) -> list[Figure]:
    ratio = subject.median_s / baseline.median_s
    rate = samples / subject.median_s
    return [
        Figure("import", f"{name} of {what}, alert engine on", subject.median_s, "s",
               spread=subject.spread(),
               baseline=f"{baseline_text}: {baseline.median_s:.4g} s ({baseline.spread()})",
               # the target is the day's; a quick run's minutes are not held to it
               target="" if quick else f"<= {TARGET_S:g}",
               met=None if quick else subject.median_s <= TARGET_S),
        Figure("import", f"{name}: engine on / engine off", ratio, "x",
               spread=f"{samples} samples, {rate:,.0f} samples/s with the engine",
               baseline=f"{baseline_text}, same run"),
    ]
