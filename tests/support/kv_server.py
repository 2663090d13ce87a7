"""A CPU inference server in a process of its own, as a new user writes one:
``vramscope.install()``, phases with request ids, a ``KVBlockPool`` (a real torch CPU buffer)
observed by a ``KVSource`` on the sink ``install()`` wired, and the pool's bookkeeping check
after every request with the server's live requests
(``python -m tests.support.kv_server NAME REQUESTS LEAK_EVERY PERIOD_S [NUM_BLOCKS]``).

Each request takes ``PROMPT_TOKENS`` (prefill) and ``DECODE_TOKENS`` one at a time (decode):
``BLOCKS_PER_REQUEST`` blocks. Every ``LEAK_EVERY``-th request (0: none) is never freed, the
bug: its blocks stay held by a request the server no longer runs, so each check after it finds
them orphaned. Requests start on a drift-free schedule of one per ``PERIOD_S``, so a leak of
``BLOCKS_PER_REQUEST`` blocks every ``LEAK_EVERY x PERIOD_S`` seconds is exact. The agent's
socket is the config's (``VRAMSCOPE_AGENT_SOCKET_PATH``). Prints its pid once started and
``done <orphaned blocks> <blocks used>`` after the last request (and the pool's sample then:
the source samples at most every 0.2 s, so its last reading may be older than the last
request), then idles (phase ``idle``) until its stdin closes. The pool holds ``NUM_BLOCKS``
blocks unless told otherwise (two servers with pools of different sizes on one GPU).
"""

from __future__ import annotations

import os
import sys
import time

from vramscope.agent.clock import Schedule
from vramscope.hooks.kv_source import KVSource
from vramscope.hooks.phase import active_sink, current_phase, requests_in_flight

import vramscope

BLOCK_SIZE = 16
PROMPT_TOKENS = 40
DECODE_TOKENS = 24
BLOCKS_PER_REQUEST = (PROMPT_TOKENS + DECODE_TOKENS) // BLOCK_SIZE  # 4
NUM_BLOCKS = 1024
# 2 x 2 layers x 2 KV heads x 32 dims x 16 tokens x 4 bytes: 16 KiB a block
POOL_SHAPE = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 32, "dtype": "float32"}


def main(name: str, requests: str, leak_every: str, period_s: str,
         num_blocks: str = str(NUM_BLOCKS)) -> int:
    report = vramscope.install()
    sink = active_sink()
    if sink is None or not report.active("sink"):
        print(f"no sink: {report}", file=sys.stderr, flush=True)
        return 1
    pool = vramscope.KVBlockPool(**POOL_SHAPE, block_size=BLOCK_SIZE,
                                 num_blocks=int(num_blocks))
    source = KVSource(sink, phase_fn=current_phase, sample_interval_s=0.2).attach(pool)
    vramscope.set_phase("idle")
    print(os.getpid(), flush=True)
    every, period = int(leak_every), float(period_s)
    schedule = Schedule(period, time.monotonic())
    for i in range(int(requests)):
        while not schedule.due(time.monotonic()):
            time.sleep(0.005)
        rid = f"{name}-{i}"
        with vramscope.phase("prefill", request_id=rid):
            pool.allocate(rid, PROMPT_TOKENS)
            with vramscope.phase("decode"):
                for _ in range(DECODE_TOKENS):
                    pool.extend(rid, 1)
        if not (every and (i + 1) % every == 0):
            pool.free(rid)
        source.check(requests_in_flight())  # the server's own view of what runs: nothing now
    report_ = source.check(requests_in_flight())
    orphaned = 0 if report_ is None else len(report_.orphaned_blocks)
    final = source.read()
    if final is not None:
        sink.put(final)
    print("done", orphaned, pool.stats().blocks_used, flush=True)
    sys.stdin.read()
    vramscope.uninstall()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
