"""Record the cuBLAS-workspace leak of transformers' generate_batch through the product.

    python3 tests/gpu/record_cublas_leak.py --out $OUT/gpu_cublas_leak.jsonl

transformers' ``generate_batch`` runs every call on a new CUDA stream, and torch keeps a cuBLAS
workspace (32 MiB on Hopper) per stream for the life of the process, so the idle floor rises by
one workspace per call. This script is what a user does: ``vramscope.install()`` with a sink
(here one that writes a trace v1 file), ``vramscope.attach_transformers(model)`` on a
random-weight Llama (4 layers, hidden 1024 by default), then ``--calls`` generate_batch calls of
16 requests with a small KV pool, one every ``--period-s`` (idle in between, so the hooks record
the idle floor and an idle-point ``memory_layout``). It writes the trace to ``--out`` and
``<out>.summary.json`` (the floor after each call, the streams seen, the make-up), and prints the
``vramscope analyze --makeup`` report of the trace with the settings the CPU test uses
(``tests/agent/test_analysis_gpu_cublas.py``, on the committed
``tests/data/gpu_cublas_leak.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

# cb_models beside this file: the script's folder is sys.path[0]. Not the repo root: its
# vramscope/ (the facade alone) would shadow the installed package on the GPU machine.
sys.path.append(str(Path(__file__).resolve().parent))

import cb_models  # noqa: E402
import torch  # noqa: E402
from vramscope.agent.config import parse_config  # noqa: E402
from vramscope.agent.trace import read_trace, write_trace  # noqa: E402

import vramscope  # noqa: E402

MIB = 2**20


def analysis_config(period_s: float) -> dict[str, float]:
    """The leak settings for a recording of a minute or two: one floor point per call."""
    return {"alerts.leak_warmup_s": 0.0, "alerts.leak_floor_window_s": period_s}


class TraceSink:
    """Keeps records in memory (the trace is small); written once at the end."""

    def __init__(self) -> None:
        self.records: list = []
        self._lock = threading.Lock()

    def put(self, record) -> None:
        with self._lock:
            self.records.append(record)

    def close(self) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the trace v1 file to write")
    p.add_argument("--calls", type=int, default=45)
    p.add_argument("--period-s", type=float, default=2.0, help="one call started every ... s")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens per request")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=256, help="KV pool blocks (16 tokens each)")
    p.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself")
    args = p.parse_args(argv)

    model = cb_models.llama(args.layers, args.hidden, device=args.device)
    cuda = args.device.startswith("cuda")
    requests = cb_models.prompts(args.requests, args.prompt)
    sink = TraceSink()
    config = parse_config({"sampling": {"allocator_interval_s": 0.05,
                                        "snapshot_interval_s": min(1.0, args.period_s / 2)}},
                          None, {})
    report = vramscope.install(config, sink=sink)
    print(report, flush=True)
    handle = vramscope.attach_transformers(model)  # the documented call: install()'s sink
    floors = []
    try:
        start = time.monotonic()
        for i in range(args.calls):
            cb_models.generate_batch(model, requests, args.new_tokens,
                                     cb_models.cb_config(args.num_blocks, 512))
            if cuda:
                torch.cuda.synchronize()
                floors.append(torch.cuda.memory_allocated(0))
                print(f"call {i + 1}: allocated {floors[-1] / MIB:.1f} MiB, reserved "
                      f"{torch.cuda.memory_reserved(0) / MIB:.1f} MiB", flush=True)
            time.sleep(max(0.5, start + (i + 1) * args.period_s - time.monotonic()))
        time.sleep(args.period_s)  # a last idle window
    finally:
        hooked, missing = list(handle.hooks), list(handle.missing)
        handle.detach()
        vramscope.uninstall()
    samples = [r for r in sink.records if isinstance(r, vramscope.Sample)]
    events = [r for r in sink.records if isinstance(r, vramscope.Event)]
    with open(args.out, "w", encoding="utf-8") as fh:
        lines = write_trace(fh, samples, events)
    summary = summarize(args, floors, hooked, missing, lines)
    Path(args.out + ".summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "makeup"}, indent=2))
    return 0 if summary["leak_detected"] and summary["diagnosis"] else 1


def summarize(args: argparse.Namespace, floors: list[int], hooked: list[str],
              missing: list[str], lines: int) -> dict:
    from vramscope.agent.alerts.offline import analyze_records
    from vramscope.agent.analysis.report_text import render_text

    trace = read_trace(args.out)  # what the CPU test reads: the file, strictly
    doc = analyze_records(trace.samples, trace.events, analysis_config(args.period_s),
                          makeup=True)
    print(render_text(doc), flush=True)
    leak = doc["devices"].get("0", {}).get("leak", {"detected": False, "evidence": "no device"})
    makeup = leak.get("makeup") or {}
    layouts = [e for e in trace.events if e.name == "memory_layout"]
    return {"versions": cb_models.versions(), "args": vars(args), "trace_lines": lines,
            "hooks": hooked, "missing": missing,
            "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            "floor_after_call_bytes": floors,
            "floor_steps_bytes": [b - a for a, b in zip(floors, floors[1:])],
            "memory_layouts": len(layouts),
            "streams_in_last_layout": len({g[1] for g in layouts[-1].data["segment_groups"]})
            if layouts else None,
            "leak_detected": leak["detected"], "evidence": leak["evidence"],
            "diagnosis": makeup.get("diagnosis"), "makeup_summary": makeup.get("summary"),
            "makeup": makeup}


if __name__ == "__main__":
    sys.exit(main())
