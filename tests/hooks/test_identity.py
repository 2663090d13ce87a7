"""The rank of a server process: from the launcher's variables, then torch.distributed once it
is initialized; one ``process_rank`` event per change, which puts the rank on the process's row
in a real SQLite store (and into its ``/metrics`` label)."""

from __future__ import annotations

from types import SimpleNamespace

from vramscope.agent.clock import FakeClock
from vramscope.agent.records import RANK_EVENT, Phase, Sample
from vramscope.dashboard.latest import latest_values
from vramscope.hooks.identity import RankInfo, RankWatch, rank_from_env


def test_rank_from_launcher_variables_first_integer_wins():
    assert rank_from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}) == RankInfo(3, 1, 8)
    assert rank_from_env({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6"}) == (
        RankInfo(5, None, 6))
    assert rank_from_env({"RANK": "x", "SLURM_PROCID": "2", "SLURM_NTASKS": "-1"}) == (
        RankInfo(2, None, None))  # a bad value is skipped, never raised
    assert rank_from_env({}) == RankInfo()


class FakeDist:
    def __init__(self) -> None:
        self.initialized = False

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def get_rank(self) -> int:
        return 6

    def get_world_size(self) -> int:
        return 8


def test_rank_watch_sends_once_then_again_when_torch_distributed_says_otherwise():
    dist = FakeDist()
    watch = RankWatch(SimpleNamespace(distributed=dist), clock=FakeClock(10.0), pid=77,
                      environ={"LOCAL_RANK": "2"})
    assert watch.read() is None  # no rank known yet: nothing to say
    dist.initialized = True
    ev = watch.read()
    assert (ev.name, ev.pid, ev.data) == (RANK_EVENT, 77, {"rank": 6, "local_rank": 2,
                                                           "world_size": 8})
    assert watch.read() is None and watch.interval_s == 60.0


def test_rank_event_lands_on_the_process_row_and_its_label(store):
    store.upsert_process(77, 1.0, name="vllm-worker")
    watch = RankWatch(None, clock=FakeClock(2.0), pid=77, environ={"RANK": "1",
                                                                  "WORLD_SIZE": "2"})
    store.write([Sample(2.0, 0, Phase.DECODE, "torch", 77, reserved_bytes=5)], [watch.read()])
    [row] = store.processes()
    assert (row["rank"], row["local_rank"], row["world_size"]) == (1, None, 2)
    latest = latest_values(store, 0, None, {77: row})
    assert [p["process"] for p in latest["processes"]] == ["vllm-worker/rank1"]
