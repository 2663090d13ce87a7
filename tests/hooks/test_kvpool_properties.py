"""Hypothesis drives random allocate / extend / free / hit sequences against a small real pool
and checks the bookkeeping invariant after every step, against a plain model of the requests."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from vramscope.hooks.kvpool import KVBlockPool, KVPoolError

BLOCK = 4
# A few shared prefixes so that prompts hit each other's blocks often.
PREFIXES = [[1] * 8, [2] * 4 + [3] * 4, [1] * 4 + [9] * 8]
REQUEST_IDS = [f"r{i}" for i in range(4)]


class PoolMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(3, 12), tier_blocks=st.integers(0, 4),
                caching=st.booleans())
    def build(self, num_blocks, tier_blocks, caching):
        self.pool = KVBlockPool(num_layers=1, num_kv_heads=1, head_dim=2, dtype="float16",
                                block_size=BLOCK, num_blocks=num_blocks, buffer=False,
                                cpu_tier_bytes=tier_blocks * 2 * 2 * BLOCK * 2,
                                prefix_caching=caching)
        self.live: dict[str, int] = {}  # request -> tokens: the model
        self.finished: set[str] = set()
        self.prompts: list[list[int]] = []  # prompts seen, for the hit rule

    def _expect_failure(self, call, blocks_needed: int) -> None:
        room = self.pool.stats().blocks_free + self.pool.stats().blocks_cached
        before = self.pool.stats()
        try:
            call()
        except KVPoolError:
            assert blocks_needed > 0
            after = self.pool.stats()
            assert after._replace(failed_allocations=before.failed_allocations) == before
            assert after.failed_allocations == before.failed_allocations + 1
            return
        assert blocks_needed <= room

    @rule(rid=st.sampled_from(REQUEST_IDS), prefix=st.sampled_from(PREFIXES),
          tail=st.lists(st.integers(0, 5), min_size=1, max_size=9))
    def allocate(self, rid, prefix, tail):
        if rid in self.live:
            return
        self._allocate(rid, prefix + tail)

    @precondition(lambda self: self.prompts)
    @rule(data=st.data(), rid=st.sampled_from(REQUEST_IDS))
    def hit(self, data, rid):
        """Ask again for a prompt seen before: a prefix hit, unless its blocks were evicted."""
        if rid not in self.live:
            self._allocate(rid, data.draw(st.sampled_from(self.prompts)))

    def _allocate(self, rid, tokens):
        self.prompts.append(tokens)
        try:
            got = self.pool.allocate(rid, token_ids=tokens)
        except KVPoolError:
            assert rid not in self.pool.request_ids
            return
        assert got.num_tokens == len(tokens) and got.hit_tokens % BLOCK == 0
        assert got.hit_tokens < len(tokens)
        self.live[rid] = len(tokens)
        self.finished.discard(rid)

    @rule(rid=st.sampled_from(REQUEST_IDS), n=st.integers(1, 9))
    def allocate_plain(self, rid, n):
        if rid in self.live:
            return
        self._expect_failure(lambda: self.pool.allocate(rid, n), self.pool.blocks_for(n))
        if rid in self.pool.request_ids:
            self.live[rid] = n
            self.finished.discard(rid)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(1, 9), with_ids=st.booleans())
    def extend(self, data, n, with_ids):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        ids = [7] * n if with_ids else None
        need = self.pool.blocks_for(self.live[rid] + n) - len(self.pool.block_table(rid))
        self._expect_failure(lambda: self.pool.extend(rid, n, ids), need)
        if self.pool.num_tokens(rid) != self.live[rid]:
            self.live[rid] += n

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.pool.free(rid)
        del self.live[rid]
        self.finished.add(rid)

    @precondition(lambda self: self.finished)
    @rule(data=st.data())
    def double_free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.finished)))
        before = self.pool.stats()
        try:
            self.pool.free(rid)
        except KVPoolError as exc:
            assert "double free" in str(exc)
        else:
            raise AssertionError(f"double free of {rid!r} was accepted")
        assert self.pool.stats() == before

    @invariant()
    def bookkeeping_holds(self):
        if not hasattr(self, "pool"):
            return
        report = self.pool.check(live_request_ids=self.live)
        assert report.ok, report
        s = self.pool.stats()
        assert s.blocks_used + s.blocks_free + s.blocks_cached == s.blocks_total
        assert set(self.pool.request_ids) == set(self.live)  # no block owned by a finished one
        for rid, n in self.live.items():
            assert self.pool.num_tokens(rid) == n
            assert len(self.pool.block_table(rid)) == self.pool.blocks_for(n)
        referenced = {b for rid in self.live for b in self.pool.block_table(rid)}
        assert len(referenced) == s.blocks_used
        assert s.tokens_used <= s.blocks_used * BLOCK
        assert s.tier_bytes <= s.tier_capacity_bytes


PoolMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40,
                                         deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
TestPoolProperties = PoolMachine.TestCase
