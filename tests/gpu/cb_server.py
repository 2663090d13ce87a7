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
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    rng = random.Random(args.seed)
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
    try:
        with model.continuous_batching_context_manager(
                generation_config=gen, continuous_batching_config=cb, block=True,
                timeout=60) as manager:
            k = 0
            while time.time() - t0 < args.duration_s:
                ids = []
                for _ in range(args.burst):
                    prompt = [rng.randrange(1, vocab) for _ in range(rng.randint(32, 192))]
                    ids.append(manager.add_request(prompt, request_id=f"r{k}",
                                                   max_new_tokens=rng.randint(16, 64)))
                    k += 1
                for rid in ids:
                    try:
                        manager.get_result(request_id=rid, timeout=120)
                        served += 1
                    except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                        errors += 1
                        print(f"request {rid}: {type(exc).__name__}: {exc}", flush=True)
                time.sleep(rng.uniform(0.2, 1.0))  # the pool empties between bursts
                if k % 600 < args.burst:
                    print(f"{time.time() - t0:7.1f} s: {served} served, {len(leaked)} leaked "
                          f"({sum(x['blocks'] for x in leaked)} blocks), {errors} errors",
                          flush=True)
    finally:
        undo()
        handle.detach()
        vramscope.uninstall()
    summary = {"pid": os.getpid(), "served": served, "errors": errors,
               "leak_every": args.leak_every, "leak_start_s": args.leak_start_s,
               "leaked_requests": len(leaked), "leaked_blocks": sum(x["blocks"] for x in leaked),
               "first_leak_ts": leaked[0]["ts"] if leaked else None, "t0": t0,
               "duration_s": time.time() - t0, "device": args.device,
               "torch": torch.__version__, **cb_models.versions()}
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    print(json.dumps(summary), flush=True)
    return 0 if served and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
