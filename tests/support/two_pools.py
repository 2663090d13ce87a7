"""Two servers on one device, with KV pools of very different sizes, scripted to the second
(issue 47 item 6: a 63-block pool vanished under a 16,384-block one, and two processes' pools
were drawn as one zig-zag series).

Two processes on device 0, each with its own pool and its own pid, as two ``KVBlockPool``
servers (or two vLLM servers) on one GPU send them: ``source="kv"`` samples once a second
from ``START`` for ``SECONDS`` seconds, both at the same times, four-second cycles:

    SMALL  pid 4100  "vllm engine core (port 8000)"    63 blocks: used 0, 21, 42, 63
           (0 %, 33.3 %, 66.7 %, 100 %)
    BIG    pid 4200  "vllm engine core (port 8001)"  16,384 blocks: used 0, 512, 1,024, 1,536
           (0 %, 3.125 %, 6.25 %, 9.375 %)

The newest reading of each (at ``NOW - 1``) is the cycle's last: the small pool full (63 of
63), the big one at 9.375 % (1,536 of 16,384); their sum would read 9.72 % (1,599 of 16,447)
and hide the full pool.
"""

from __future__ import annotations

from vramscope.agent.config import parse_config
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store

NOW = 1_800_000_000.0
SECONDS = 60
START = NOW - SECONDS
SMALL, BIG = 4100, 4200  # pids
NAMES = {SMALL: "vllm engine core (port 8000)", BIG: "vllm engine core (port 8001)"}
TOTAL = {SMALL: 63, BIG: 16_384}
STEP = {SMALL: 21, BIG: 512}  # blocks more each second of a four-second cycle
WINDOW = (START, NOW)  # with MAX_POINTS: buckets of 1 s, one sample of each pool in each
MAX_POINTS = SECONDS


def used(pid: int, second: int) -> int:
    return STEP[pid] * (second % 4)


WORKER = 4300  # a process with allocator samples and no pool (a worker beside its engine)


def samples(pools: tuple[int, ...] = (SMALL, BIG), worker: bool = False) -> list[Sample]:
    out = [Sample(START + k, 0, Phase.DECODE, "kv", pid, kv_blocks_used=used(pid, k),
                  kv_blocks_total=TOTAL[pid], kv_blocks_cached=0)
           for k in range(SECONDS) for pid in pools]
    if worker:
        out += [Sample(START + k, 0, Phase.DECODE, "torch", WORKER, allocated_bytes=1 << 30,
                       reserved_bytes=2 << 30) for k in range(SECONDS)]
    return out


def config(**raw: object):
    return parse_config(dict(raw), None, {})


def two_pools_store(url: str, pools: tuple[int, ...] = (SMALL, BIG), worker: bool = False
                    ) -> Store:
    """The scripted database at ``url`` (SQLite or PostgreSQL), with the servers listed as
    the agent's connected clients; ``pools``: whose pools, ``worker``: with ``WORKER``."""
    store = Store.open(url, host_name="h")
    store.describe_device(0, uuid="GPU-two-pools", name="NVIDIA H100 80GB HBM3",
                          total_bytes=80 << 30)
    store.write(samples(pools, worker), [])
    names = {**{pid: NAMES[pid] for pid in pools}, **({WORKER: "worker"} if worker else {})}
    for pid, name in names.items():
        store.upsert_process(pid, START, name=name, model="tiny-llama", device_indexes=(0,))
        store.upsert_process(pid, NOW - 1)
    store.write_agent_stats(NOW - 1, clients=2, rows_per_s=2.0, queue_depth=0,
                            dropped_total=0, rejected_total=0, db_size_bytes=None)
    return store
