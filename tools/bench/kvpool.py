"""``vramscope bench kvpool``: KV pool allocate / extend / free with the observer off and on.

One serving-shaped workload (batches of requests sharing system prompts: allocate with token
ids, one-token decode extends, free) runs on identical bookkeeping-only pools: one with no
observer (the free disabled path), one with vramscope's ``KVSource`` as installed by default,
and one with ``extend_events=True`` (an event per block a growing request takes). The sink is
the real in-server ``SocketSink`` with its sender thread not started, so ``put`` is exactly the
server thread's share (a bounded deque append under a lock) and nothing leaves the process.
Rounds alternate between the pools (``interleaved``), so machine noise hits them alike.

The sender thread runs in the server's process too (under its GIL): its encoding of a round's
records (``SocketSink._frames``, what it does before each send) is timed
on the records a warm default round puts, and added to the observer's overhead.

Reported: pool operations per second; the observer's overhead in percent of the workload,
with the sender's encoding (target <= 5 %) and without it; its cost per observed event in
microseconds (target <= 1 us), from the run with the most events; medians over rounds, with
the per-round spread.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from tools.bench import BenchOptions, Figure, Timing, interleaved

if TYPE_CHECKING:
    from vramscope.hooks.kvpool import KVBlockPool
    from vramscope.hooks.sink import RecordSink

# A 7B-class shape (32 layers, 8 KV heads, head dim 128, bf16), 16-token blocks.
SHAPE: dict[str, Any] = dict(num_layers=32, num_kv_heads=8, head_dim=128, dtype="bfloat16",
                             block_size=16)
BASELINE = "the same workload on a pool with no observer (free disabled path), same run"


def _prompts(batch: int, prefix_tokens: int, suffix_tokens: int) -> list[list[int]]:
    """``batch`` prompts over 4 shared system prompts, each with its own suffix."""
    systems = [[1000 * (s + 1) + t for t in range(prefix_tokens)] for s in range(4)]
    return [systems[i % 4] + [i * 7919 + t for t in range(suffix_tokens)] for i in range(batch)]


def _workload(pool: KVBlockPool, prompts: list[list[int]], decode_steps: int) -> int:
    """Run one batch through the pool; returns the number of pool operations."""
    ids = [f"req-{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts):
        pool.allocate(rid, token_ids=prompt)
    for _ in range(decode_steps):
        for rid in ids:
            pool.extend(rid, 1)
    for rid in ids:
        pool.free(rid)
    return len(ids) * (2 + decode_steps)


def _sizes(options: BenchOptions) -> tuple[int, int, int, int, int]:
    """(batch, prefix tokens, suffix tokens, decode steps, rounds)."""
    # Short rounds (about half a millisecond) and many of them: on a shared machine a round
    # that a context switch hits is an outlier the median ignores, instead of every round.
    # 128 decode steps a request: short next to chat outputs (ShareGPT's average is longer).
    return (4, 32, 16, 8, 21) if options.quick else (8, 128, 32, 128, 1001)


def _observed_pool(num_blocks: int, sink: RecordSink,
                   extend_events: bool | None) -> KVBlockPool:
    from vramscope.hooks.kv_source import KVSource
    from vramscope.hooks.kvpool import KVBlockPool

    pool = KVBlockPool(**SHAPE, num_blocks=num_blocks, buffer=False)
    if extend_events is not None:
        KVSource(sink, extend_events=extend_events).attach(pool)
    return pool


def _events_per_round(num_blocks: int, prompts: list[list[int]], steps: int,
                      extend_events: bool) -> int:
    """Events the observer puts in one warm round (samples are rate-limited, not counted)."""
    from vramscope.hooks.sink import ListSink

    sink = ListSink()
    pool = _observed_pool(num_blocks, sink, extend_events)
    _workload(pool, prompts, steps)
    sink.records.clear()
    _workload(pool, prompts, steps)
    return len(sink.events())


def run(options: BenchOptions) -> list[Figure]:
    from vramscope.hooks.client import SocketSink

    batch, prefix, suffix, steps, rounds = _sizes(options)
    prompts = _prompts(batch, prefix, suffix)
    num_blocks = batch * ((prefix + suffix + steps) // 16 + 2) + 64
    sink = SocketSink("/nonexistent/vramscope-bench.sock", start=False)
    pools = [_observed_pool(num_blocks, sink, mode) for mode in (None, False, True)]
    ops = 0
    for pool in pools:  # warm: later rounds see prefix hits, as a serving pool does
        ops = _workload(pool, prompts, steps)
    timings = interleaved([partial(_workload, p, prompts, steps) for p in pools], rounds)
    events = [_events_per_round(num_blocks, prompts, steps, mode) for mode in (False, True)]
    encode_s, records = _sender_encoding(num_blocks, prompts, steps, sink, rounds)
    return _figures(timings, ops, events) + [_with_sender(timings, encode_s, records)]


def _sender_encoding(num_blocks: int, prompts: list[list[int]], steps: int, sink: Any,
                     rounds: int) -> tuple[Timing, int]:
    """The sender thread's encoding of the records one warm default round puts."""
    from vramscope.hooks.sink import ListSink

    recorder = ListSink()
    pool = _observed_pool(num_blocks, recorder, False)
    _workload(pool, prompts, steps)
    recorder.records.clear()
    _workload(pool, prompts, steps)
    records = list(recorder.records)
    [timing] = interleaved([partial(sink._frames, records)], max(3, rounds // 10))
    return timing, len(records)


def _with_sender(timings: list[Timing], encode: Timing, records: int) -> Figure:
    off, on, _ = timings
    pct = 100 * (on.median_s - off.median_s + encode.median_s) / off.median_s
    per_record = 1e6 * encode.median_s / max(records, 1)
    return Figure("kvpool", "observer overhead with the sender's encoding (default events)",
                  pct, "%", spread=f"encoding {per_record:.2f} us a record, {records} records "
                                   f"a round; {encode.spread(1e3, 'ms')}",
                  baseline=BASELINE, target="<= 5", met=pct <= 5.0)


def _overhead(off: Timing, on: Timing) -> tuple[float, str]:
    ratios = sorted(100 * (b / a - 1) for a, b in zip(off.samples_s, on.samples_s))
    spread = (f"per-round min {ratios[0]:.2f} % / max {ratios[-1]:.2f} % over "
              f"{len(ratios)} rounds")
    return 100 * (on.median_s / off.median_s - 1), spread


def _figures(timings: list[Timing], ops: int, events: list[int]) -> list[Figure]:
    off, on, on_ext = timings
    pct, pct_spread = _overhead(off, on)
    pct_ext, ext_spread = _overhead(off, on_ext)
    per_event_us = 1e6 * (on_ext.median_s - off.median_s) / max(events[1], 1)
    return [
        Figure("kvpool", "pool ops/s, observer off", ops / off.median_s, "ops/s",
               spread=off.spread(1e3, "ms") + f"; {ops} ops a round"),
        Figure("kvpool", "observer overhead (default events), server thread only", pct, "%",
               spread=f"{pct_spread}; {events[0]} events a round", baseline=BASELINE),
        Figure("kvpool", "observer overhead (extend events on)", pct_ext, "%",
               spread=f"{ext_spread}; {events[1]} events a round", baseline=BASELINE),
        Figure("kvpool", "cost per observed event", per_event_us, "us",
               spread=f"(on - off) / {events[1]} events; on {on_ext.spread(1e3, 'ms')}",
               baseline=BASELINE, target="<= 1", met=per_event_us <= 1.0),
    ]
