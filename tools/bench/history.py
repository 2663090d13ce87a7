"""``vramscope bench history``: what a week of history costs ``analyze --db`` and retention.

The store comes from :mod:`tools.history_generator` (8 devices at 10 Hz for
7 days as the default tiers keep them: raw samples for the newest day, 6.9 M, which is what
``analyze --db`` reads; ``options.quick``: 2 devices at one sample per 5 s for a day), or is
the database at ``--db`` as it is when it already holds samples (a store that keeps raw samples
longer: ``analyze --db`` streams one device at a time, so its memory does not grow with them).

- **analyze --db**: ``vramscope analyze --db URL --json`` of the whole store in a child
  process, its wall time and peak RSS (its ``VmHWM``, polled), against the baseline of
  ``vramscope analyze FILE --json`` of the same records exported to a trace file, run
  alternately. Targets: peak RSS <= 1 GB, time within 2x of the file's.
- **retention step**: the CPU of one steady-state ``Retention.step`` (nothing due: the
  question every 30 s) on the old store against the same step on an hour of the same
  history, same run. Target: within 2x.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

from tools.bench import BenchOptions, Figure, Timing, rounds_or
from tools.history_generator import History, generate

if TYPE_CHECKING:
    from vramscope.agent.store import Store


def run(options: BenchOptions) -> list[Figure]:
    from vramscope.agent.store import Store

    history = (History(devices=2, hz=0.2, days=1) if options.quick
               else History(devices=8, hz=10.0, days=7))
    rounds = rounds_or(options, 2 if options.quick else 3)
    with tempfile.TemporaryDirectory(prefix="vramscope-bench-") as workdir:
        url = options.db_url or f"sqlite:///{os.path.join(workdir, 'week.db')}"
        with Store.open(url, host_name="bench-host") as store:
            if store.count("samples") == 0:
                generate(store, history)
            trace = _export(store, workdir)
            steps = _retention_steps(store, workdir, history, rounds)
        return _analyze(url, trace, rounds) + steps


def _export(store: Store, workdir: str) -> str:
    from vramscope.agent.trace import write_sorted_trace

    path = os.path.join(workdir, "week.jsonl")
    with open(path, "w", encoding="utf-8") as out:  # as `vramscope export` writes it
        write_sorted_trace(out, store.iter_samples(None), store.iter_events(None))
    return path


def _child(argv: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS bytes of ``vramscope ARGV`` in a child process."""
    env = {**os.environ, "VRAMSCOPE_AGENT_HOST_NAME": "bench-host"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "vramscope", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # The child's own high-water mark (VmHWM), polled while it runs: wait4's ru_maxrss keeps
    # the parent's resident size at fork, so a child of this process (grown to gigabytes by
    # the export) reported the parent's peak, not its own.
    peak = 0
    while True:
        pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        peak = max(peak, _high_water_bytes(proc.pid))
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        err = proc.stderr.read().decode(errors="replace")[-500:] if proc.stderr else ""
        raise RuntimeError(f"vramscope {' '.join(argv)} exited {proc.returncode}: {err}")
    return wall, peak


def _high_water_bytes(pid: int) -> int:
    """``VmHWM`` of a running process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _analyze(url: str, trace: str, rounds: int) -> list[Figure]:
    db_t, file_t = Timing([]), Timing([])
    db_rss: list[float] = []
    file_rss: list[float] = []
    for _ in range(rounds):
        for argv, timing, rss in ((["analyze", "--db", url, "--json"], db_t, db_rss),
                                  (["analyze", trace, "--json"], file_t, file_rss)):
            wall, peak = _child(argv)
            timing.samples_s.append(wall)
            rss.append(peak)
    ratio = db_t.median_s / file_t.median_s
    peak_mb = max(db_rss) / 1e6
    return [
        Figure("history", "analyze --db, whole store", db_t.median_s, "s",
               spread=db_t.spread(), baseline=f"analyze FILE of the same records "
                                              f"{file_t.median_s:.3g} s"),
        Figure("history", "analyze --db time / analyze FILE time", ratio, "x",
               spread=f"file {file_t.spread()}",
               baseline="the same records from a trace file, same run",
               target="<= 2", met=ratio <= 2),
        Figure("history", "analyze --db peak RSS", peak_mb, "MB",
               spread=f"per run {[round(r / 1e6) for r in db_rss]} MB; analyze FILE "
                      f"{max(file_rss) / 1e6:.0f} MB", target="<= 1000", met=peak_mb <= 1000),
    ]


def _retention_steps(store: Store, workdir: str, history: History, rounds: int) -> list[Figure]:
    from vramscope.agent.store import Store

    hour = History(devices=history.devices, hz=history.hz, days=1 / 24, end_s=history.end_s)
    with Store.open(f"sqlite:///{os.path.join(workdir, 'hour.db')}",
                    host_name="bench-host") as young:
        generate(young, hour)
        old_t, young_t = Timing([]), Timing([])
        for _ in range(max(rounds, 5)):
            for s, timing in ((store, old_t), (young, young_t)):
                timing.samples_s.append(_step_cpu_s(s, history.end_s))
    ratio = old_t.median_s / max(young_t.median_s, 1e-6)
    return [Figure("history", "retention step with nothing due, old / 1 h store", ratio, "x",
                   spread=f"old {old_t.spread(1e3, 'ms')}; 1 h {young_t.spread(1e3, 'ms')}",
                   baseline="the same step on an hour of the same history, same run",
                   target="<= 2", met=ratio <= 2)]


def _step_cpu_s(store: Store, end_s: float) -> float:
    from vramscope.agent.clock import FakeClock
    from vramscope.agent.retention import Retention

    retention = Retention(raw_s=30 * 86_400, rollup_s=90 * 86_400, step_rows=5000,
                          clock=FakeClock(end_s + 60))
    retention.step(store)  # reads the watermark once, as an agent does at start
    t0 = time.process_time()
    retention.step(store)
    return time.process_time() - t0
