"""KVBlockPool on a real pool of a handful of blocks backed by CPU tensors."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from vramscope.hooks.kvpool import KVBlockPool, KVPoolError, KVPoolObserver, kv_cache_bytes

try:
    import torch
except ImportError:  # the pool's bookkeeping works without torch; its tensors do not
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")

# 2 layers x 2 KV heads x head dim 4 x 4 tokens x float32: 2*2*2*4*4*4 = 512 bytes a block.
SHAPE = dict(num_layers=2, num_kv_heads=2, head_dim=4, dtype="float32", block_size=4)
BLOCK_BYTES = 512


def make_pool(num_blocks: int = 6, **kw) -> KVBlockPool:
    return KVBlockPool(**SHAPE, num_blocks=num_blocks, **kw)


def used_free_cached(pool: KVBlockPool) -> tuple[int, int, int]:
    s = pool.stats()
    return s.blocks_used, s.blocks_free, s.blocks_cached


def fill_request(pool: KVBlockPool, rid: str, seed: int) -> dict[int, tuple]:
    """Write seeded random K/V into every layer of a request; return what was written."""
    gen = torch.Generator().manual_seed(seed)
    n = pool.num_tokens(rid)
    written = {}
    for layer in range(pool.num_layers):
        k, v = (torch.randn(n, 2, 4, generator=gen) for _ in range(2))
        pool.write_kv(rid, layer, 0, k, v)
        written[layer] = (k, v)
    return written


# --- construction and size -------------------------------------------------------------------
@needs_torch
def test_size_follows_the_standard_formula_and_the_buffer_matches_it():
    pool = make_pool(6)
    assert kv_cache_bytes(2, 2, 4, 4, 4) == BLOCK_BYTES
    assert pool.bytes_per_block == BLOCK_BYTES
    assert pool.size_bytes == 6 * BLOCK_BYTES
    t = pool.buffer.tensor
    assert t.shape == (6, 2, 2, 4, 2, 4)
    assert t.numel() * t.element_size() == pool.size_bytes


def test_budget_in_bytes_takes_as_many_whole_blocks_as_fit():
    pool = KVBlockPool(**SHAPE, budget_bytes=3 * BLOCK_BYTES + 511)
    assert pool.num_blocks == 3
    assert pool.size_bytes == 1536


@needs_torch
def test_dtype_by_name_or_torch_dtype_sets_element_size():
    a = KVBlockPool(num_layers=16, num_kv_heads=4, head_dim=128, dtype="bfloat16",
                    block_size=16, num_blocks=2, buffer=False)
    b = KVBlockPool(num_layers=16, num_kv_heads=4, head_dim=128, dtype=torch.bfloat16,
                    block_size=16, num_blocks=2, buffer=False)
    assert a.bytes_per_block == b.bytes_per_block == 2 * 16 * 4 * 128 * 16 * 2 == 524288
    assert a.buffer is None and a.dtype_name == b.dtype_name == "bfloat16"


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_blocks=4, budget_bytes=4096), "exactly one of num_blocks or budget_bytes"),
    (dict(), "exactly one of num_blocks or budget_bytes"),
    (dict(budget_bytes=100), "budget_bytes=100 is smaller than one block (512 bytes)"),
    (dict(num_blocks=0), "num_blocks must be a positive integer, got 0"),
    (dict(num_blocks=4, cpu_tier_bytes=100), "cpu_tier_bytes=100 is smaller than one block"),
])
def test_bad_construction_quotes_the_bad_value(kwargs, message):
    with pytest.raises(KVPoolError) as err:
        KVBlockPool(**SHAPE, **kwargs)
    assert message in str(err.value)


def test_unknown_dtype_name_is_refused():
    with pytest.raises(KVPoolError, match="unknown dtype 'float13'"):
        KVBlockPool(**{**SHAPE, "dtype": "float13"}, num_blocks=2)


# --- allocate / extend / free ----------------------------------------------------------------
def test_allocate_extend_free_and_token_occupancy():
    pool = make_pool(6)
    a = pool.allocate("a", 10)
    assert a.block_ids == (0, 1, 2) and a.hit_tokens == 0
    s = pool.stats()
    assert (s.blocks_used, s.blocks_free, s.tokens_used) == (3, 3, 10)
    assert s.block_usage_ratio == 0.5 and s.token_usage_ratio == 10 / 12
    assert pool.extend("a", 2) == ()  # fits in the last block's 2 free slots
    assert pool.extend("a", 1) == (3,)
    assert pool.block_table("a") == (0, 1, 2, 3) and pool.num_tokens("a") == 13
    assert pool.stats().tokens_used == 13
    released, cached = pool.free("a")
    assert released == (3, 2, 1, 0) and cached == ()  # last-first
    assert used_free_cached(pool) == (0, 6, 0)
    assert pool.stats().tokens_used == 0


def test_freed_blocks_are_reused_most_recent_first():
    pool = make_pool(6)
    pool.allocate("a", 4)
    pool.allocate("b", 4)
    pool.free("a")
    assert pool.allocate("c", 4).block_ids == (0,)


def test_can_allocate_counts_free_and_evictable_blocks():
    pool = make_pool(4)
    pool.allocate("a", token_ids=list(range(9)))  # 3 blocks, 2 full ones keyed
    assert pool.can_allocate(4) and not pool.can_allocate(5)
    pool.free("a")  # block 2 free, blocks 0 and 1 cached: 4 allocatable
    assert used_free_cached(pool) == (0, 2, 2)
    assert pool.can_allocate(16) and not pool.can_allocate(17)


# --- prefix sharing --------------------------------------------------------------------------
def test_prefix_hit_after_free_reuses_cached_blocks():
    pool = make_pool(6)
    prompt = list(range(10))
    pool.allocate("a", token_ids=prompt)
    pool.free("a")
    assert used_free_cached(pool) == (0, 4, 2)
    b = pool.allocate("b", token_ids=prompt)
    assert b.block_ids[:2] == (0, 1) and b.hit_tokens == 8
    assert used_free_cached(pool) == (3, 3, 0)
    s = pool.stats()
    assert (s.prefix_query_tokens, s.prefix_hit_tokens) == (20, 8)


def test_live_requests_share_blocks_with_refcounts():
    pool = make_pool(6)
    pool.allocate("a", token_ids=list(range(10)))
    b = pool.allocate("b", token_ids=list(range(8)) + [99, 98])
    assert b.block_ids[:2] == (0, 1) and b.hit_tokens == 8
    assert [pool.refcount(i) for i in (0, 1, 2, 3)] == [2, 2, 1, 1]
    assert pool.stats().tokens_used == 12  # shared blocks counted once: 8 + 2 + 2
    pool.free("a")
    assert [pool.refcount(i) for i in (0, 1, 2)] == [1, 1, 0]
    assert used_free_cached(pool) == (3, 3, 0)
    assert pool.free("b") == ((3,), (1, 0))
    assert used_free_cached(pool) == (0, 4, 2)


def test_a_different_first_block_breaks_the_chain():
    pool = make_pool(6)
    pool.allocate("a", token_ids=list(range(10)))
    b = pool.allocate("b", token_ids=[7] + list(range(1, 10)))
    assert b.hit_tokens == 0 and set(b.block_ids).isdisjoint({0, 1, 2})


def test_the_last_prompt_token_is_never_a_hit():
    pool = make_pool(6)
    pool.allocate("a", token_ids=list(range(8)))
    pool.free("a")
    assert pool.allocate("b", token_ids=list(range(8))).hit_tokens == 4


def test_blocks_completed_by_extend_become_shareable():
    pool = make_pool(6)
    pool.allocate("a", token_ids=[1, 2, 3])
    pool.extend("a", token_ids=[4, 5, 6])
    assert pool.allocate("b", token_ids=[1, 2, 3, 4, 5]).hit_tokens == 4


def test_extend_without_token_ids_ends_the_chain():
    pool = make_pool(6)
    pool.allocate("a", token_ids=[1, 2, 3])
    pool.extend("a", 5)
    assert pool.allocate("b", token_ids=[1, 2, 3, 0, 0, 0, 0, 0, 0]).hit_tokens == 0


def test_prefix_caching_off_never_hits_nor_caches():
    pool = make_pool(6, prefix_caching=False)
    pool.allocate("a", token_ids=list(range(10)))
    pool.free("a")
    assert used_free_cached(pool) == (0, 6, 0)
    assert pool.allocate("b", token_ids=list(range(10))).hit_tokens == 0


# --- eviction --------------------------------------------------------------------------------
def test_eviction_only_when_free_runs_out_and_least_recent_first():
    pool = make_pool(6)
    pool.allocate("a", token_ids=list(range(9)))  # blocks 0, 1 keyed; 2 partial
    pool.free("a")  # released last-first: 1 is cached before 0, so 1 is least recent
    pool.allocate("c", 16)  # the 4 free blocks: no eviction yet
    assert pool.stats().evictions == 0 and used_free_cached(pool) == (4, 0, 2)
    assert pool.allocate("d", 4).block_ids == (1,)
    assert pool.stats().evictions == 1
    pool.free("d")
    pool.free("c")
    # block 0's key survives, block 1's is gone: the chain hits one block only
    assert pool.allocate("e", token_ids=list(range(9))).hit_tokens == 4


def test_a_hit_refreshes_recency():
    pool = make_pool(4)
    pool.allocate("x", token_ids=[1, 1, 1, 1, 0])  # block 0 keyed
    pool.allocate("y", token_ids=[2, 2, 2, 2, 0])  # block 2 keyed
    pool.free("x")
    pool.free("y")  # cached order: 0 then 2
    pool.allocate("x2", token_ids=[1, 1, 1, 1, 0])
    pool.free("x2")  # block 0 cached again, now most recent
    pool.allocate("big", 12)  # 2 free blocks, then evict the least recent: 2
    assert pool.block_table("big")[-1] == 2
    assert pool._key[0] is not None and pool._key[2] is None


# --- CPU tier --------------------------------------------------------------------------------
@needs_torch
def test_offload_and_restore_round_trip_is_byte_exact():
    pool = make_pool(4, cpu_tier_bytes=2 * BLOCK_BYTES)
    prompt = list(range(9))
    pool.allocate("a", token_ids=prompt)
    written = fill_request(pool, "a", seed=7)
    pool.free("a")
    pool.allocate("filler", 16)  # takes 2 free blocks, then evicts both cached ones
    s = pool.stats()
    assert (s.evictions, s.offloads, s.tier_blocks, s.tier_bytes) == (2, 2, 2, 1024)
    assert not pool.tier.pinned  # no CUDA here: plain host memory
    pool.free("filler")
    b = pool.allocate("b", token_ids=prompt)
    assert (b.hit_tokens, b.restored_tokens) == (8, 8)
    assert pool.stats().restores == 2 and pool.stats().tier_blocks == 0
    for layer, (k, v) in written.items():
        got_k, got_v = pool.read_kv("b", layer)
        assert got_k[:8].numpy().tobytes() == k[:8].numpy().tobytes()
        assert got_v[:8].numpy().tobytes() == v[:8].numpy().tobytes()


def test_tier_is_bounded_in_bytes_and_drops_its_oldest():
    pool = make_pool(3, cpu_tier_bytes=BLOCK_BYTES + 100)  # one slot
    pool.allocate("a", token_ids=list(range(9)))
    pool.free("a")
    pool.allocate("filler", 12)  # evicts both cached blocks; the tier keeps the later one
    s = pool.stats()
    assert (s.offloads, s.tier_blocks, s.tier_bytes, s.tier_capacity_bytes) == (2, 1, 512, 512)
    assert pool.tier.dropped == 1
    pool.free("filler")
    # block 1 went first (least recent) and was dropped; block 0 (the chain's head) remains
    assert pool.allocate("b", token_ids=list(range(9))).restored_tokens == 4


@needs_torch
def test_bookkeeping_only_pool_behaves_like_the_buffered_one():
    ops = [("alloc", "a", list(range(9))), ("alloc", "b", list(range(5))), ("free", "a", None),
           ("alloc", "c", list(range(13))), ("free", "b", None)]
    pools = [make_pool(5, cpu_tier_bytes=BLOCK_BYTES), make_pool(5, cpu_tier_bytes=BLOCK_BYTES,
                                                                  buffer=False)]
    for pool in pools:
        for op, rid, toks in ops:
            pool.allocate(rid, token_ids=toks) if op == "alloc" else pool.free(rid)
    assert pools[1].buffer is None and pools[1].tier.host is None
    assert pools[0].stats() == pools[1].stats()
    with pytest.raises(KVPoolError, match="bookkeeping only"):
        pools[1].read_kv("c", 0)


# --- bad calls -------------------------------------------------------------------------------
def test_free_unknown_and_double_free_are_told_apart():
    pool = make_pool(4)
    with pytest.raises(KVPoolError, match="no such request"):
        pool.free("ghost")
    pool.allocate("a", 3)
    pool.free("a")
    with pytest.raises(KVPoolError, match=r"'a': it was already freed \(double free\)"):
        pool.free("a")
    with pytest.raises(KVPoolError, match="double free"):
        pool.extend("a", 1)
    assert pool.check_idle().ok


def test_extend_past_the_pool_fails_and_changes_nothing():
    pool = make_pool(3)
    pool.allocate("a", 6)
    before = pool.stats()
    with pytest.raises(KVPoolError, match="extending by 7 tokens needs 2 more blocks"):
        pool.extend("a", 7)
    after = pool.stats()
    assert after._replace(failed_allocations=0) == before
    assert after.failed_allocations == 1
    assert pool.num_tokens("a") == 6 and pool.block_table("a") == (0, 1)
    assert pool.check(["a"]).ok


def test_allocate_more_than_the_pool_fails_and_changes_nothing():
    pool = make_pool(3)
    pool.allocate("a", token_ids=list(range(5)))
    pool.free("a")
    before = pool.stats()
    with pytest.raises(KVPoolError, match=r"\(2 free, 1 cached of 3; use can_allocate\(\)"):
        pool.allocate("b", 13)
    assert pool.stats()._replace(failed_allocations=0) == before
    assert "b" not in pool.request_ids and pool.check_idle().ok


@pytest.mark.parametrize("call, message", [
    (lambda p: p.allocate("a", 1), "request 'a' already holds blocks"),
    (lambda p: p.allocate("b", 0), "num_tokens must be a positive integer, got 0"),
    (lambda p: p.allocate("b"), "give num_tokens or token_ids"),
    (lambda p: p.allocate("b", 3, token_ids=[1, 2]), "num_tokens=3 but 2 token_ids"),
    (lambda p: p.allocate("", 3), "request_id must be a non-empty string"),
    (lambda p: p.extend("a", -1), "num_new_tokens must be a positive integer, got -1"),
    pytest.param(lambda p: p.write_kv("a", 0, 2, torch.zeros(2, 2, 4), torch.zeros(2, 2, 4)),
                 "tokens [2, 4) are outside request 'a''s 3 tokens", marks=needs_torch),
])
def test_bad_arguments_raise_clear_errors_and_leave_the_pool_consistent(call, message):
    pool = make_pool(4)
    pool.allocate("a", 3)
    before = pool.stats()
    with pytest.raises(KVPoolError) as err:
        call(pool)
    assert message in str(err.value)
    assert pool.stats() == before and pool.check(["a"]).ok


# --- the bookkeeping check -------------------------------------------------------------------
def test_check_reports_blocks_held_by_requests_the_server_forgot():
    pool = make_pool(6)
    pool.allocate("live", 5)
    pool.allocate("leaked", token_ids=list(range(9)))
    report = pool.check(live_request_ids=["live"])
    assert not report.ok and report.problems == ()
    assert report.orphaned_blocks == (2, 3, 4) and report.orphan_owners == ("leaked",)
    idle = pool.check_idle()
    assert idle.orphaned_blocks == (0, 1, 2, 3, 4)


def test_check_finds_a_broken_refcount():
    pool = make_pool(4)
    pool.allocate("a", 5)
    pool._ref[3] = 1  # what a bookkeeping bug would leave: a referenced block nobody holds
    report = pool.check(["a"])
    assert not report.ok
    assert report.orphaned_blocks == (3,)
    assert "block 3: refcount 1 but 0 block-table references" in report.problems
    assert "used 3 + free 2 + cached 0 != total 4" in report.problems


# --- observer --------------------------------------------------------------------------------
class Recorder(KVPoolObserver):
    def __init__(self):
        self.calls = []


def _recording(name):
    def method(self, pool, *args):
        self.calls.append((name, *args))
    return method


for _name in [n for n in vars(KVPoolObserver) if n.startswith("on_")]:
    setattr(Recorder, _name, _recording(_name))


def test_observer_sees_every_step_in_order():
    rec = Recorder()
    pool = make_pool(3, observer=rec, cpu_tier_bytes=BLOCK_BYTES)
    pool.allocate("a", token_ids=list(range(5)))
    pool.extend("a", 4)
    pool.free("a")
    pool.allocate("b", 12)
    with pytest.raises(KVPoolError):
        pool.allocate("c", 1)
    names = [c[0] for c in rec.calls]
    assert names == ["on_allocate", "on_hit", "on_extend", "on_free", "on_offload", "on_evict",
                     "on_allocate", "on_allocate_failed"]
    assert rec.calls[1] == ("on_hit", "a", 0, 5)
    assert rec.calls[2] == ("on_extend", "a", (2,), 9)
    assert rec.calls[3] == ("on_free", "a", (2, 1), (0,))
    assert rec.calls[5] == ("on_evict", 0, True)


def test_a_failing_observer_is_counted_never_raised():
    class Broken(KVPoolObserver):
        def on_allocate(self, pool, allocation):
            raise RuntimeError("observer bug")

    pool = make_pool(3, observer=Broken())
    pool.allocate("a", 4)
    pool.allocate("b", 4)
    assert pool.stats().observer_errors == 2
    assert pool.check(["a", "b"]).ok


# --- torch is optional -----------------------------------------------------------------------
def test_importing_and_using_a_bookkeeping_pool_never_imports_torch():
    code = ("import sys; from vramscope.hooks.kvpool import KVBlockPool; "
            "p = KVBlockPool(num_layers=2, num_kv_heads=2, head_dim=4, num_blocks=4, "
            "buffer=False); p.allocate('a', token_ids=[1, 2, 3, 4, 5]); p.free('a'); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=__file__.rsplit("/tests/", 1)[0])
    assert out.stdout.strip() == "False"


def test_without_torch_the_pool_keeps_bookkeeping_and_says_so_once(monkeypatch, caplog):
    import vramscope.hooks.kvpool as kvpool
    import vramscope.hooks.kvpool_tier as tier

    monkeypatch.setattr(kvpool, "load_torch", lambda: None)
    monkeypatch.setattr(tier, "_no_torch_logged", False)
    with caplog.at_level(logging.INFO, logger="vramscope.kvpool"):
        pools = [make_pool(4, cpu_tier_bytes=BLOCK_BYTES) for _ in range(2)]
    assert all(p.buffer is None and p.tier.host is None for p in pools)
    assert [r.getMessage() for r in caplog.records] == [
        "vramscope: torch is not installed; KVBlockPool keeps bookkeeping only (no tensors). "
        "Install torch for a real KV buffer."]
    assert pools[0].allocate("a", 5).block_ids == (0, 1)
