"""The sampler loop (run_once with a fake allocator source) and the allocator counter parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vramscope.agent.clock import FakeClock
from vramscope.agent.records import Phase
from vramscope.hooks import phase as ph
from vramscope.hooks.allocator import (
    Counters,
    FakeAllocatorSource,
    counters_from_flat,
    counters_from_nested,
)
from vramscope.hooks.sampler import Every, Sampler
from vramscope.hooks.sink import ListSink

DATA = Path(__file__).resolve().parents[1] / "data"
MiB = 2**20


def nested_stats():
    return json.loads((DATA / "cuda_memory_stats_nested.json").read_text())["stats"]


def flatten(nested, prefix=""):
    """``torch.cuda.memory_stats``'s own flattening, restated."""
    out = {}
    for key, value in nested.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def test_nested_counters_pick_the_all_pool_current_values():
    c = counters_from_nested(nested_stats())
    stats = flatten(nested_stats())
    assert c == Counters(
        allocated=stats["allocated_bytes.all.current"],
        allocated_peak=stats["allocated_bytes.all.peak"],
        reserved=stats["reserved_bytes.all.current"],
        active=stats["active_bytes.all.current"],
        inactive_split=stats["inactive_split_bytes.all.current"],
        requested=stats["requested_bytes.all.current"],
        num_alloc_retries=stats["num_alloc_retries"], num_ooms=stats["num_ooms"])
    # Recorded on the H200 after the read-cost bench freed its 64 x 4 MiB tensors.
    assert (c.allocated, c.allocated_peak, c.reserved) == (0, 256 * MiB, 260 * MiB)


def test_flat_and_nested_agree_and_empty_means_uninitialized():
    assert counters_from_flat(flatten(nested_stats())) == counters_from_nested(nested_stats())
    assert counters_from_nested({}) is None and counters_from_flat({}) is None


@pytest.fixture
def rig():
    clock = FakeClock(1_700_000_000.0)
    alloc = FakeAllocatorSource(Counters(1 * MiB, 1 * MiB, 2 * MiB, 1 * MiB, 0, 1 * MiB, 0, 0),
                                clock=clock, pid=7, limit_bytes=80 * MiB)
    sink = ListSink()
    ph.configure(sink=ListSink(), clock=clock, sources=[alloc])
    yield clock, alloc, sink
    ph.reset()


def test_run_once_samples_with_phase_and_exact_counters(rig):
    clock, alloc, sink = rig
    sampler = Sampler(sink, [Every(alloc, 0.1)], clock=clock)
    ph.set_phase("prefill")
    alloc.set(allocated=5 * MiB, reserved=8 * MiB, inactive_split=MiB)
    assert sampler.run_once() == 1
    [s] = sink.samples()
    assert (s.ts_s, s.phase, s.source, s.pid) == (1_700_000_000.0, Phase.PREFILL, "torch", 7)
    assert (s.allocated_bytes, s.reserved_bytes, s.inactive_split_bytes, s.device_total_bytes) == (
        5 * MiB, 8 * MiB, MiB, 80 * MiB)


def test_tasks_run_only_when_due_and_do_not_drift(rig):
    clock, alloc, sink = rig
    fast, slow = Every(alloc, 0.1), Every(alloc, 1.0)
    sampler = Sampler(sink, [fast, slow], clock=clock)
    assert sampler.run_once() == 2  # both due at start
    clock.advance(0.05)
    assert sampler.run_once() == 0
    clock.advance(0.07)  # 0.12: fast is due (at 0.1), next at 0.2, not 0.22
    assert sampler.run_once() == 1
    clock.advance(0.08)  # 0.20
    assert sampler.run_once() == 1
    assert sampler.seconds_until_due() == pytest.approx(0.1)
    clock.advance(5.0)  # far behind: one read each, then back on a fresh schedule
    assert sampler.run_once() == 2
    assert sampler.seconds_until_due() == pytest.approx(0.1)


def test_uninitialized_cuda_gives_no_samples_and_a_broken_task_is_counted(rig):
    clock, _, sink = rig

    class Broken:
        interval_s = 0.1

        def read(self):
            raise RuntimeError("boom")

    quiet = FakeAllocatorSource(None, clock=clock)
    sampler = Sampler(sink, [Every(quiet, 0.1), Broken()], clock=clock)
    assert sampler.run_once() == 0
    assert sampler.failures == 1 and sink.records == []


def test_list_results_are_put_one_by_one(rig):
    clock, alloc, sink = rig

    class Two:
        interval_s = 1.0

        def read(self):
            return [alloc.read(), alloc.read()]

    assert Sampler(sink, [Two()], clock=clock).run_once() == 2
    assert len(sink.samples()) == 2


def test_thread_starts_samples_and_stops(rig):
    _, alloc, sink = rig
    sampler = Sampler(sink, [Every(alloc, 0.001)])  # the real clock, for the real thread
    sampler.start()
    while not sink.samples():
        pass
    sampler.stop()
    assert not sampler.running
    assert sink.samples()[0].allocated_bytes == MiB


def test_bad_interval_is_refused_with_its_value():
    with pytest.raises(ValueError, match="got 0"):
        Every(object(), 0)


def test_a_task_with_a_start_delay_waits_for_it(rig):
    clock, alloc, sink = rig
    task = Every(alloc, 10.0)
    task.start_delay_s = 10.0
    sampler = Sampler(sink, [task], clock=clock)
    assert sampler.run_once() == 0
    clock.advance(10.0)
    assert sampler.run_once() == 1


def test_hooks_bench_needs_cuda():
    import torch
    from vramscope.agent.errors import VramscopeError

    from tools.bench import BenchOptions
    from tools.bench.hooks import run

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(VramscopeError, match="needs CUDA"):
        run(BenchOptions(quick=True))
