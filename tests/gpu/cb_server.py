"""A continuous-batching server for the GPU machine's "one answer" check (issue 31): a random-weight
Llama behind transformers' ``continuous_batching_context_manager`` (one manager, one
``PagedAttentionCache`` for the whole run, as a server keeps it), ``vramscope.install()`` and
``vramscope.attach_transformers(model)`` sending to a running agent's socket. Clients submit
bursts of requests and pause between them, so the pool is empty now and then (the hooks' idle
check: blocks used while no request holds a block table are orphaned).

``--leak-every N`` makes it a leaking server the way a server bug does: from ``--leak-start-s``
on, every N-th finished request's block tables are dropped without its blocks being freed (the
scheduler's ``free_blocks`` for it loses them), so the pool's used blocks grow and the hooks
report them as ``kv_orphaned_blocks``. A real leak of KV memory, found by the KV pool's own
check, not by a trend: no window is shortened for it.

``--keep-bytes B --keep-every-s T`` is the slow leak a floor trend must find (issue 30's GPU
check): from ``--leak-start-s`` on, the first request that finishes after each ``T`` seconds
leaves a ``B``-byte CUDA tensor behind (a per-request cache that is never evicted), so the
allocated floor rises ``B / T`` bytes a second whatever the throughput. ``--never-idle`` keeps
``--in-flight`` requests submitted at all times (a new one as each finishes) instead of bursts
with pauses: the pool is never empty, the floor is read from the KV figures, not an idle moment.
A CUDA OOM (a kept tensor that no longer fits, or the generation failing for memory) ends the
run at once, without waiting for the requests in flight: the summary carries ``oom`` (when and
where) and the exit status is 3. The hooks' OOM observer has sent the post-mortem by then.

    PYTHONPATH=/tmp/site:. python3 tests/gpu/cb_server.py --agent-socket S --duration-s 660 \\
        --leak-every 150 --out DIR/cb-leak.json

Dry-run on CPU with ``--device cpu`` (a tiny model). Writes a JSON summary (requests served,
leaked requests and blocks, errors) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Any

import torch
from vramscope.agent.config import parse_config

import vramscope
from tests.gpu import cb_models


def leak_frees(every: int, start_s: float, t0: float, leaked: list[dict[str, Any]]) -> Any:
    """Make every ``every``-th ``PagedAttentionCache.free_blocks`` after ``start_s`` drop the
    request's block tables and keep its blocks (both internal layouts: transformers 5.17's
    ``group_cache_managers``, 5.24's ``cache_allocators``). Patched on the class before the
    cache exists, so the hooks' wrapper on the instance wraps this one. Returns the undo."""
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    original = PagedAttentionCache.free_blocks
    count = [0]

    def free_blocks(self: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        if every and time.time() - t0 >= start_s and count[0] % every == 0:
            owners = list(getattr(self, "group_cache_managers", ()) or ()) or list(
                getattr(self, "cache_allocators", {}).values())
            blocks = sum(len(o.block_table.pop(request_id, ())) for o in owners)
            leaked.append({"ts": time.time(), "request_id": str(request_id), "blocks": blocks})
            return None
        return original(self, request_id, *args, **kwargs)

    PagedAttentionCache.free_blocks = free_blocks

    def undo() -> None:
        PagedAttentionCache.free_blocks = original
    return undo


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agent-socket", required=True)
    p.add_argument("--out", required=True, help="the run's JSON summary")
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--leak-every", type=int, default=0, help="0: a healthy server")
    p.add_argument("--leak-start-s", type=float, default=120.0)
    p.add_argument("--blocks", type=int, default=4096, help="the KV pool's blocks (page 16)")
    p.add_argument("--burst", type=int, default=6, help="requests submitted together")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep-bytes", type=int, default=0, help="0: no tensor kept")
    p.add_argument("--keep-every-s", type=float, default=6.0)
    p.add_argument("--never-idle", action="store_true")
    p.add_argument("--in-flight", type=int, default=8, help="requests open (--never-idle)")
    p.add_argument("--memory-fraction", type=float, default=0.0,
                   help="torch's per-process limit (a fraction of the device); 0: none")
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    rng = random.Random(args.seed)
    if cuda and args.memory_fraction:  # torch's OOM at this limit, the device not yet full
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction)
    model = cb_models.llama(4 if cuda else 2, 1024 if cuda else 128,
                            vocab=32000 if cuda else 1024, device=args.device,
                            kv_heads=4 if cuda else 1)
    config = parse_config({"agent": {"socket_path": args.agent_socket}}, None, {})
    report = vramscope.install(config)
    print(report, flush=True)
    handle = vramscope.attach_transformers(model)
    print(f"transformers hooks: {handle.hooks}; missing: {handle.missing}", flush=True)
    t0 = time.time()
    leaked: list[dict[str, Any]] = []
    undo = leak_frees(args.leak_every, args.leak_start_s, t0, leaked)
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=64, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = cb_models.cb_config(args.blocks, 2048)
    served = errors = 0
    vocab = 32000 if cuda else 1024
    kept: list[torch.Tensor] = []  # the slow leak: tensors no one frees
    n_kept = 0
    kept_ts: list[float] = []
    oom: dict[str, Any] = {}
    k = 0

    def submit(manager: Any) -> None:
        nonlocal k
        prompt = [rng.randrange(1, vocab) for _ in range(rng.randint(32, 192))]
        manager.add_request(prompt, request_id=f"r{k}", max_new_tokens=rng.randint(16, 64))
        k += 1

    def finish(manager: Any) -> None:
        """Wait for the next finished request, whichever it is (``get_result`` with an id
        returns None when another request's result is first in the queue)."""
        nonlocal served, errors
        result = manager.get_result(timeout=120)
        error = getattr(result, "error", None)
        if error and "out of memory" in str(error).lower() and not oom:
            oom.update(ts=time.time(), where="generation", error=str(error)[:300])
            print(f"CUDA OOM in the generation: {str(error)[:200]}", flush=True)
            return
        if result is None or not result.is_finished() or error:
            errors += 1
            print(f"no result in 120 s, or unfinished: {result!r:.200}", flush=True)
            return
        served += 1
        now = time.time()
        if (args.keep_bytes and now - t0 >= args.leak_start_s
                and (not kept_ts or now - kept_ts[-1] >= args.keep_every_s)):
            try:
                kept.append(torch.empty(args.keep_bytes, dtype=torch.uint8, device=args.device))
            except torch.OutOfMemoryError as exc:
                oom.update(ts=time.time(), where="kept tensor", error=str(exc)[:300])
                print(f"{now - t0:7.1f} s: CUDA OOM keeping tensor {len(kept) + 1} "
                      f"({len(kept) * args.keep_bytes} bytes kept): {str(exc)[:200]}", flush=True)
                return
            kept_ts.append(now)
        if served % 600 == 0:
            print(f"{now - t0:7.1f} s: {served} served, {len(leaked)} leaked "
                  f"({sum(x['blocks'] for x in leaked)} blocks), {len(kept)} kept, "
                  f"{errors} errors", flush=True)

    try:
        with model.continuous_batching_context_manager(
                generation_config=gen, continuous_batching_config=cb, block=True,
                timeout=60) as manager:
            if args.never_idle:  # a new request as each one finishes
                for _ in range(args.in_flight):
                    submit(manager)
                while time.time() - t0 < args.duration_s and errors < 10 and not oom:
                    finish(manager)
                    submit(manager)
                for _ in range(0 if oom else args.in_flight):
                    finish(manager)
            else:
                while time.time() - t0 < args.duration_s and errors < 10 and not oom:
                    for _ in range(args.burst):
                        submit(manager)
                    for _ in range(args.burst):
                        finish(manager)
                    time.sleep(rng.uniform(0.2, 1.0))  # the pool empties between bursts
            if oom:  # what a crashed server gives back: the memory, at once
                n_kept = len(kept)
                kept.clear()
                if cuda:
                    torch.cuda.empty_cache()
    finally:
        undo()
        handle.detach()
        vramscope.uninstall()
    summary = {"pid": os.getpid(), "served": served, "errors": errors,
               "leak_every": args.leak_every, "leak_start_s": args.leak_start_s,
               "leaked_requests": len(leaked), "leaked_blocks": sum(x["blocks"] for x in leaked),
               "first_leak_ts": leaked[0]["ts"] if leaked else None, "t0": t0,
               "never_idle": args.never_idle, "kept_tensors": n_kept or len(kept),
               "kept_bytes": (n_kept or len(kept)) * args.keep_bytes,
               "first_kept_ts": kept_ts[0] if kept_ts else None,
               "last_kept_ts": kept_ts[-1] if kept_ts else None, "oom": oom or None,
               "duration_s": time.time() - t0, "device": args.device,
               "torch": torch.__version__, **cb_models.versions()}
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    print(json.dumps(summary), flush=True)
    if oom:
        return 3
    return 0 if served and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
