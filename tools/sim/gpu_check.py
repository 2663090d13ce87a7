"""Check the caching-allocator model against PyTorch's real allocator on a CUDA device.

One seeded sequence of allocations (every pool: small, mid-size, large) and frees in random
order runs twice: as ``torch.empty(n, dtype=uint8, device="cuda")`` under
``set_per_process_memory_fraction`` and through :class:`CachingAllocatorModel` with the same
limit. After every step both report allocated, reserved, inactive-split and requested bytes and
the retry and OOM counts; the first step where they differ is printed.

    python -m tools.sim.gpu_check [--steps 3000] [--limit-mib 1024] [--out FILE.jsonl]

Needs a fresh process (nothing else allocated on the device).
``tests/agent/test_sim_gpu_allocator.py`` runs it under the ``gpu`` marker; one H200 run (torch
2.11, the defaults) is recorded in ``tests/data/gpu_allocator_check.jsonl``, which
``tests/agent/test_sim_vs_h200_replay.py`` replays through the model on the CPU.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any

from vramscope.agent.sim.caching_allocator import CachingAllocatorModel, SimulatedOOM

FIELDS = ("allocated", "reserved", "inactive_split", "requested", "num_alloc_retries",
          "num_ooms")
MiB = 1 << 20


def op_sequence(seed: int, steps: int) -> list[tuple[str, int]]:
    """("alloc", size) or ("free", k): free the k-th live allocation (by age, modulo count)."""
    rng = random.Random(seed)
    ops: list[tuple[str, int]] = []
    live = 0
    for _ in range(steps):
        if live and rng.random() < 0.45:
            ops.append(("free", rng.randrange(1 << 30)))
            live -= 1
            continue
        kind = rng.random()
        if kind < 0.6:
            size = rng.randint(1, MiB)
        elif kind < 0.9:
            size = rng.randint(MiB + 1, 10 * MiB)
        else:
            size = rng.randint(10 * MiB, 200 * MiB)
        ops.append(("alloc", size))
        live += 1
    return ops


def run_model(ops: list[tuple[str, int]], limit_bytes: int) -> list[dict[str, int]]:
    a = CachingAllocatorModel(limit_bytes)
    handles: list[int] = []
    out = []
    for kind, value in ops:
        if kind == "alloc":
            try:
                handles.append(a.malloc(value))
            except SimulatedOOM:
                handles.append(-1)
        else:
            handle = handles.pop(value % len(handles))
            if handle != -1:
                a.free(handle)
        out.append({"allocated": a.allocated_bytes, "reserved": a.reserved_bytes,
                    "inactive_split": a.inactive_split_bytes, "requested": a.requested_bytes,
                    "num_alloc_retries": a.num_alloc_retries, "num_ooms": a.num_ooms})
    return out


def cuda_limit(torch: Any, limit_bytes: int) -> int:
    """Set the fraction for ``limit_bytes``; returns the limit the allocator will enforce."""
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = limit_bytes / total
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return int(fraction * float(total))


def run_cuda(torch: Any, ops: list[tuple[str, int]]) -> list[dict[str, int]]:
    tensors: list[Any] = []
    out = []
    for kind, value in ops:
        if kind == "alloc":
            try:
                tensors.append(torch.empty(value, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                tensors.append(None)
        else:
            del tensors[value % len(tensors)]
        s = torch.cuda.memory_stats(0)
        out.append({"allocated": s["allocated_bytes.all.current"],
                    "reserved": s["reserved_bytes.all.current"],
                    "inactive_split": s["inactive_split_bytes.all.current"],
                    "requested": s["requested_bytes.all.current"],
                    "num_alloc_retries": s["num_alloc_retries"], "num_ooms": s["num_ooms"]})
    return out


def first_divergence(model: list[dict[str, Any]], real: list[dict[str, Any]]
                     ) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
    for i, (m, r) in enumerate(zip(model, real)):
        if any(m[f] != r[f] for f in FIELDS):
            return i, m, r
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.sim.gpu_check")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--limit-mib", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write both series as JSON Lines here")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 1
    ops = op_sequence(args.seed, args.steps)
    limit = cuda_limit(torch, args.limit_mib * MiB)
    real = run_cuda(torch, ops)
    model = run_model(ops, limit)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            for i, (op, m, r) in enumerate(zip(ops, model, real)):
                f.write(json.dumps({"step": i, "op": op, "model": m, "cuda": r}) + "\n")
    diverged = first_divergence(model, real)
    if diverged is None:
        print(f"model == CUDA allocator on all {len(ops)} steps (limit {limit} bytes); "
              f"final {real[-1]}")
        return 0
    i, m, r = diverged
    print(f"first divergence at step {i} ({ops[i]}): model {m} vs CUDA {r}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
