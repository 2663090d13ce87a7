"""``bench allocators``: the three designs on a scripted trace, and the bench's figures."""

from __future__ import annotations

from vramscope.agent.sim.workload import WorkloadSpec

from tools.bench import BenchOptions
from tools.bench.allocators import KV_BYTES_PER_TOKEN, Op, designs, kv_ops, replay, run

MiB = 1 << 20
T10 = 10 * MiB // KV_BYTES_PER_TOKEN  # tokens in a 10 MiB buffer (320)


def scripted() -> list[Op]:
    """Four 10 MiB buffers fill 40 MiB; the 1st and 3rd end; a 20 MiB one arrives."""
    ops = [Op(float(i), 1, "alloc", f"r{i}", T10) for i in range(4)]
    ops += [Op(5.0, 0, "free", "r0", 0), Op(6.0, 0, "free", "r2", 0)]
    return ops + [Op(7.0, 1, "alloc", "big", 2 * T10), Op(8.0, 0, "free", "big", 0)]


def test_scripted_trace_through_the_three_designs():
    by = {d.name: replay(d, scripted()) for d in designs(budget_bytes=40 * MiB)}
    # first fit: two 10 MiB holes, no 20 MiB one -> OOM with half the arena free
    assert (by["first_fit"].ooms, by["first_fit"].served) == (1, 2)
    assert by["first_fit"].ext_frag_at_oom == [0.5]
    # caching allocator: the two holes are whole cached segments, released and re-malloc'd
    assert (by["caching"].ooms, by["caching"].served) == (0, 3)
    assert by["caching"].peak_reserved_bytes == 40 * MiB
    # paged: any free blocks will do
    assert (by["paged"].ooms, by["paged"].served) == (0, 3)
    assert by["paged"].peak_reserved_bytes == 40 * MiB


def test_growing_a_buffer_leaves_a_hole_in_the_caching_allocator():
    ops = [Op(0.0, 1, "alloc", "a", 100), Op(1.0, 1, "alloc", "b", 100),
           Op(2.0, 2, "grow", "a", 200)]
    _, caching, _ = designs(budget_bytes=40 * MiB)
    result = replay(caching, ops)
    a = caching.a
    # a and b (3.125 MiB each) share one 20 MiB segment; a grows to 256 tokens (8 MiB, the next
    # multiple of 64), placed after b while the old a is still live; then old a is freed
    assert result.ooms == 0 and a.num_segments == 1
    assert a.allocated_bytes == 3_276_800 + 8 * MiB
    blocks = [(b["size"], b["state"]) for b in a.snapshot()[0]["blocks"]]
    assert blocks == [(3_276_800, "inactive"), (3_276_800, "active_allocated"),
                      (8 * MiB, "active_allocated"), (20 * MiB - 6_553_600 - 8 * MiB, "inactive")]
    assert a.inactive_split_bytes == 20 * MiB - a.allocated_bytes


def test_kv_ops_are_ordered_and_complete():
    spec = WorkloadSpec(rate_per_s=1.0, burst_rate_per_s=2.0, seed=1)
    ops = kv_ops(spec, 60.0)
    assert ops == sorted(ops)
    allocs = {op.request_id for op in ops if op.kind == "alloc"}
    frees = {op.request_id for op in ops if op.kind == "free"}
    assert allocs == frees and len(allocs) > 30


def test_bench_quick_reports_every_design():
    figures = run(BenchOptions(quick=True))
    names = {f.metric for f in figures}
    for design in ("first_fit", "caching", "paged"):
        assert f"{design}.ooms" in names and f"{design}.served" in names
    paged = {f.metric: f.value for f in figures if f.metric.startswith("paged.")}
    assert paged["paged.ext_frag_under_load"] == 0.0
