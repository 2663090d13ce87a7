"""A database as the vLLM plugin fills it on a host without a GPU, scripted to the second.

One server (pid 4242, "vllm engine core (port 8000)", model tiny-llama) on device 0, the
records the plugin makes (``source="kv"`` samples at 10 Hz while steps run, one at the moment
it goes idle; request, ``server_load`` and ``kv_preempted`` events), two pids of earlier runs of
the server, and the agent's reports. Nothing samples while the server is idle (no NVML on a CPU
host), which is what the freshness and the timeline's gaps are about:

    NOW-120 .. NOW-100   busy: KV used 10..19 blocks (peak 19), 6 requests, 2 preemptions
    NOW-100              idle sample: 0 blocks used
    NOW-100 .. NOW-49    nothing (51 s: the timeline must show a gap, not a slope)
    NOW-49  .. NOW-40    busy: 4 blocks used, 2 requests
    NOW-40  .. NOW       idle, nothing sent (40 s: longer than stale_after_s)
"""

from __future__ import annotations

from pathlib import Path

from vramscope.agent.config import parse_config
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.store import Store

NOW = 1_800_000_000.0
PID, OLD_PIDS = 4242, (4100, 4200)
NAME, MODEL = "vllm engine core (port 8000)", "tiny-llama"
TOTAL = 63  # blocks, vLLM's null block left out
BUSY1, IDLE1, BUSY2, IDLE2 = NOW - 120, NOW - 100, NOW - 49, NOW - 40
LOAD = [(NOW - 120, 3, 2), (NOW - 115, 5, 0), (NOW - 100, 0, 0), (NOW - 49, 2, 0),
        (NOW - 40, 0, 0)]  # (ts, running, waiting): server_load events
PREEMPTED = (NOW - 110, NOW - 109.9)  # one bucket of 1 s
REQUESTS = [NOW - 120 + i for i in range(6)] + [NOW - 49, NOW - 48.5]
# kv_alloc: (ts, hit_tokens, preempted_hit_tokens, query_tokens): a prefix hit, a preempted
# request finding its own blocks again (not a hit to vLLM, nor a query), another hit: vLLM's
# hit rate 48 / 128 = 37.5 %
ALLOCS = [(NOW - 118, 32, 0, 80), (NOW - 110, 0, 64, 0), (NOW - 48, 16, 0, 48)]
# tokens: (ts, prompt, generated, since_s): those of the requests finished over 10 s of the
# first burst, and a count of one instant in the second
TOKENS = [(NOW - 110, 500, 200, NOW - 120), (NOW - 48, 100, 40, NOW - 48)]
WINDOW = (NOW - 150, NOW)  # with max_points=300: buckets of 1 s (the per-second grid)


def kv(ts: float, used: int, phase: Phase = Phase.DECODE) -> Sample:
    return Sample(ts, 0, phase, "kv", PID, kv_blocks_used=used, kv_blocks_total=TOTAL,
                  kv_blocks_cached=0)


def samples() -> list[Sample]:
    out = [kv(BUSY1 + k / 10, 10 + k % 10) for k in range(200)]
    out.append(kv(IDLE1, 0, Phase.IDLE))
    out += [kv(BUSY2 + k / 10, 4) for k in range(90)]
    out.append(kv(IDLE2, 0, Phase.IDLE))
    return out


def events() -> list[Event]:
    out = [Event(t, "request_start", 0, PID, request_id=f"cmpl-{i}")
           for i, t in enumerate(REQUESTS)]
    out += [Event(t, "server_load", 0, PID, data={"running": r, "waiting": w})
            for t, r, w in LOAD]
    out += [Event(t, "kv_preempted", 0, PID, request_id="cmpl-1", data={"count": 1})
            for t in PREEMPTED]
    out += [Event(t, "kv_alloc", 0, PID, request_id=f"a{i}", data={
        "blocks": 4, "tokens": 100, "hit_tokens": hit, "preempted_hit_tokens": reused,
        "query_tokens": queried}) for i, (t, hit, reused, queried) in enumerate(ALLOCS)]
    out += [Event(t, "tokens", 0, PID, data={"prompt_tokens": p, "generation_tokens": g,
                                             "since_s": since})
            for t, p, g, since in TOKENS]
    return out


def config(**raw: object):
    return parse_config(dict(raw), None, {})


def vllm_store(path: Path, *, agent_ts: float | None = NOW - 2, clients: int = 1,
               rows_per_s: float = 0.0, seen_ts: float = NOW - 2) -> Store:
    """The scripted database; ``agent_ts`` None: no agent report at all. ``seen_ts``: when
    the agent last listed the server as a client (its process row's ``last_seen_s``)."""
    store = Store.open(f"sqlite:///{path}", host_name="h")
    store.describe_device(0, uuid="CPU-0", name="cpu", total_bytes=None)
    store.write(samples(), events())
    for age, pid in zip((3600.0, 1800.0), OLD_PIDS):
        store.upsert_process(pid, NOW - age - 600, name=NAME, model=MODEL)
        store.upsert_process(pid, NOW - age)
    store.upsert_process(PID, NOW - 300, name=NAME, model=MODEL)
    store.upsert_process(PID, seen_ts)
    if agent_ts is not None:
        store.write_agent_stats(agent_ts, clients=clients, rows_per_s=rows_per_s,
                                queue_depth=0, dropped_total=0, rejected_total=0,
                                db_size_bytes=None)
    return store
