"""``vramscope bench analysis``: analysis throughput of a 1M-sample trace vs reading it.

The subject is ``analyze_records`` (every model and the built-in alert rules, as ``vramscope
analyze`` runs them); the baseline is ``read_trace`` of the same file (JSON parsing and
validation), timed interleaved in the same process. Target: analysis takes well under the time
to read (ratio <= 0.5).

The trace is shaped like a real recording: per 0.1 s tick, one allocator sample (``torch``),
one NVML sample and one KV-pool sample, each with only its own fields (as the hooks, the NVML
source and the demo's simulated servers write them), from the steady scenario of
``tools.bench.labelled_recordings``.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

from tools.bench import BenchOptions, Figure, interleaved

if TYPE_CHECKING:
    from vramscope.agent.records import Sample

FULL_SAMPLES = 1_000_000
QUICK_SAMPLES = 20_000
DT_S = 0.1  # a 10 Hz allocator reader, as sampling.allocator_interval_s defaults to


def split_sources(s: Sample) -> tuple[Sample, Sample, Sample]:
    """One all-fields simulated sample as the three samples a real recording has."""
    torch = s._replace(source="torch", device_used_bytes=None, kv_blocks_used=None,
                       kv_blocks_total=None, kv_blocks_cached=None)
    nvml = s.__class__(s.ts_s, s.device, source="nvml", device_used_bytes=s.device_used_bytes,
                       device_total_bytes=s.device_total_bytes)
    kv = s.__class__(s.ts_s, s.device, s.phase, "kv", kv_blocks_used=s.kv_blocks_used,
                     kv_blocks_total=s.kv_blocks_total, kv_blocks_cached=s.kv_blocks_cached)
    return torch, nvml, kv


def run(options: BenchOptions) -> list[Figure]:
    from vramscope.agent.alerts.offline import analyze_records
    from vramscope.agent.trace import read_trace, write_trace

    from tools.bench.labelled_recordings import simulate

    n = QUICK_SAMPLES if options.quick else FULL_SAMPLES
    sc = simulate("bench", "steady", 7, n * DT_S / 3, DT_S)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.jsonl")
        with open(path, "w", encoding="utf-8") as fh:
            write_trace(fh, [part for s in sc.samples for part in split_sources(s)], sc.events)
        del sc
        trace = read_trace(path)
        count = len(trace.samples)
        read, analyze = interleaved(
            [lambda: read_trace(path),
             lambda: analyze_records(trace.samples, trace.events, None)],
            rounds=2 if options.quick else 3)
    ratio = analyze.median_s / read.median_s
    return [
        Figure("analysis", f"analysis throughput ({count} samples)", count / analyze.median_s,
               "samples/s", spread=analyze.spread(), baseline="read_trace of the same file"),
        Figure("analysis", "trace read throughput (baseline)", count / read.median_s,
               "samples/s", spread=read.spread()),
        Figure("analysis", "analysis time / read time", ratio, "ratio",
               spread=f"analysis {analyze.median_s:.3g} s vs read {read.median_s:.3g} s (medians)",
               baseline="read_trace, same run", target="<= 0.5", met=ratio <= 0.5),
    ]
