"""Load-aware floors: the part of allocated memory that the server's work explains.

A server that is never idle has no idle floor: the least memory between requests still holds
the KV cache of the requests in flight, and that follows the load (more requests at midday than
at night). A floor that rises with the load is not a leak; a floor that rises with nothing the
server holds for its work is. So the leak detector looks at the *residual* floor,
``allocated − bytes_per_block × kv_blocks_used``, where the bytes per KV block are estimated
online from how allocated memory moves with the blocks in use:

- each pair of consecutive memory samples gives a ratio ``Δallocated / Δkv_blocks_used`` (the
  KV figures may come on their own samples, another ``source``: the latest is kept);
- the estimate is the median of the last ``KEEP`` ratios (unweighted: the rare big steps, a
  batch ending while the next one's prefill activations arrive, are the outliers, and a median
  weighted by the step would follow them);
- it is used only when allocated memory clearly moves *with* the blocks: at least
  ``MIN_RATIOS`` ratios, and at least ``MIN_POSITIVE`` of them positive. A preallocated
  pool (allocated memory independent of the blocks in use) gives ratios scattered around 0: the
  estimate is 0 and the floor is left as it is.

A server whose KV cache is per request (no pool, no blocks: ``generate()``'s cache, grown as
each request decodes) reports the tokens its requests in flight hold instead
(``kv_tokens_used``, ``attach_transformers``): the same estimator is fed those tokens, bytes
per token held, and the residual floor is ``allocated − bytes_per_token × kv_tokens_used``
(``observe_kv_figures``: the blocks where a server reports them, the tokens only where it
never did). A request's KV grows with its tokens, so the tokens, not the requests, are what
the floor holds: a floor less bytes per request rises for minutes after an idle moment as the
requests in flight age, one less bytes per token does not. Per token, ``MIN_POSITIVE_TOKENS``
of the ratios must be positive (a prefill's activations come and go beside a few tokens'
growth), and the ratios survive the warm-up's restarts (``restart(warming=True)``); until the
estimate is clear (or where memory does not follow the tokens: a preallocated cache) the
``LeakDetector`` estimates the floor from the requests in flight, as without KV figures.

Without any KV figures the same estimator is fed the requests in flight (by the request events):
bytes per request in flight, taken off the floor after each request (``LeakDetector``), so
that a floor that follows the number of requests in flight, a load ramp, is not a leak either.

A leak is slow against the sample interval, so it barely biases ratios taken between
consecutive samples; a warm-up ramp is not (graph capture, caches: gigabytes in minutes while
the first batches fill the KV cache), so the ratios are forgotten each time the sequential
test restarts during the warm-up (``restart``), and the estimate is made afresh from what
follows. Memory that is leaked *as KV blocks* (blocks never freed, counted as used)
is explained away here; the KV pool's orphan check (``kv_orphaned_blocks``) names that one.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque

from vramscope.agent.analysis.stats import median_sorted

KEEP = 2048  # ratios kept (bounded; enough that the median barely moves: its drift × the
# blocks in use would read as floor noise)
MIN_RATIOS = 32
MIN_POSITIVE = 0.8
# per token held: a per-request cache always moves with its tokens, but between two samples a
# prefill's activations come or go beside them (a few tokens' growth against a prefill's
# gigabyte), so fewer ratios are positive than with a pool's blocks
MIN_POSITIVE_TOKENS = 0.6


class BlockBytes:
    """Online estimate of the allocated bytes per KV block in use, or per KV token held where
    the server reports tokens and no blocks (``unit``; see the module docstring)."""

    def __init__(self) -> None:
        self._ratios: deque[float] = deque()  # in arrival order, at most KEEP
        self._sorted: list[float] = []  # the same, sorted: the median on every sample, cheaply
        self._positive = 0  # how many are > 0
        self._last: tuple[int, int] | None = None  # (allocated, blocks) of the last sample
        self.kv_used: int | None = None  # the latest blocks in use seen on any sample
        self.unit = "block"  # what kv_used counts: "block", or "token" (observe_kv_figures)
        self._blocks_seen = False
        self._estimate = 0.0

    def observe_kv(self, used: int | None) -> None:
        """Note a sample's KV blocks in use (any source)."""
        if used is not None and used >= 0:
            self.kv_used = used

    def observe_kv_figures(self, blocks: int | None, tokens: int | None) -> None:
        """Note a sample's KV figures: the blocks in use where the server reports them (a
        pool: its tokens are a share of its blocks' room), else the tokens its requests in
        flight hold (a per-request cache), counted per token from then on."""
        if blocks is not None:
            self._blocks_seen = True
            self.unit = "block"
            if blocks >= 0:  # observe_kv(blocks), inline: every KV sample comes here
                self.kv_used = blocks
        elif tokens is not None and not self._blocks_seen:
            self.unit = "token"
            self.observe_kv(tokens)

    def observe(self, allocated: int) -> None:
        """Note a memory sample: its allocated bytes against the latest blocks in use."""
        used = self.kv_used
        if used is None:
            return
        last = self._last
        self._last = (allocated, used)
        if last is None or used == last[1]:
            return
        ratio = (allocated - last[0]) / (used - last[1])
        ratios, ordered = self._ratios, self._sorted
        ratios.append(ratio)
        insort(ordered, ratio)
        self._positive += ratio > 0
        if len(ratios) > KEEP:
            old = ratios.popleft()
            del ordered[bisect_left(ordered, old)]
            self._positive -= old > 0
        # _median_if_clear(), inline: this runs for nearly every sample
        n = len(ordered)
        least = MIN_POSITIVE_TOKENS if self.unit == "token" else MIN_POSITIVE
        if n < MIN_RATIOS or self._positive < least * n:
            self._estimate = 0.0
        else:
            mid = n // 2
            median = float(ordered[mid]) if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0
            self._estimate = median if median > 0.0 else 0.0  # max(0.0, median)

    def _median_if_clear(self) -> float:
        """``estimate`` over the kept ratios, from the sorted copy (no sort per sample)."""
        least = MIN_POSITIVE_TOKENS if self.unit == "token" else MIN_POSITIVE
        return median_if_clear(self._sorted, self._positive, least)

    def restart(self, warming: bool = False) -> None:
        """Forget the ratios: they were taken while the floor was still warming up (a ramp in
        allocated memory while the KV cache fills reads as bytes per block). ``warming``: the
        sequential test restarted, not a reload; tokens are kept then: every request's end
        gives a ratio of its own KV over its own tokens that no ramp biases, and growth that
        began in the first minutes restarts that test for as long as it lasts."""
        if warming and self.unit == "token":
            return
        self._ratios.clear()
        self._sorted.clear()
        self._positive = 0
        self._estimate = 0.0

    @property
    def bytes_per_block(self) -> float:
        return self._estimate

    def explained(self) -> int:
        """Bytes the KV blocks in use explain now (0 without KV data or a clear estimate)."""
        if self.kv_used is None or self._estimate <= 0:
            return 0
        return int(self._estimate * self.kv_used)


def median_if_clear(ordered: list[float], positive: int,
                    least_positive: float = MIN_POSITIVE) -> float:
    """The median of the sorted ratios, or 0 when allocated memory does not clearly move with
    the blocks (fewer than ``MIN_RATIOS`` ratios, or fewer than ``least_positive`` of them > 0,
    ``positive`` being how many are)."""
    if len(ordered) < MIN_RATIOS or positive < least_positive * len(ordered):
        return 0.0
    return max(0.0, median_sorted(ordered))


def estimate(ratios: deque[float] | list[float]) -> float:
    """:func:`median_if_clear` of ratios in any order."""
    return median_if_clear(sorted(ratios), sum(1 for r in ratios if r > 0))
