"""Per-phase memory: peaks by phase, prefill spikes over the decode baseline, peak attribution.

A *prefill spike* is the rise of allocated memory during one prefill episode (consecutive
prefill samples) above the allocated memory of the last non-prefill sample before it (the
decode or idle baseline). The largest spike seen is the allowance the OOM-risk model keeps free.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from vramscope.agent.records import Phase, Sample

PHASES = (Phase.PREFILL, Phase.DECODE, Phase.IDLE, Phase.SETUP, Phase.UNKNOWN)


class PhaseStats(NamedTuple):
    samples: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int


class Spike(NamedTuple):
    ts_s: float  # when the episode's peak was reached
    size_bytes: int  # peak − baseline
    peak_bytes: int
    baseline_bytes: int


def phase_stats(samples: Iterable[Sample]) -> dict[str, PhaseStats]:
    """Sample count and peak allocated / reserved per phase (every phase present, zeros if none)."""
    acc = PhaseAccumulator()
    for s in samples:
        acc.add(s)
    return acc.stats()


class PhaseAccumulator:
    """:func:`phase_stats` one sample at a time (streaming analysis: three numbers a phase)."""

    def __init__(self) -> None:
        self._counts = {p: [0, 0, 0] for p in PHASES}

    def add(self, s: Sample) -> None:
        c = self._counts[s.phase]
        c[0] += 1
        if s.allocated_bytes is not None and s.allocated_bytes > c[1]:
            c[1] = s.allocated_bytes
        if s.reserved_bytes is not None and s.reserved_bytes > c[2]:
            c[2] = s.reserved_bytes

    def stats(self) -> dict[str, PhaseStats]:
        return {p.value: PhaseStats(*c) for p, c in self._counts.items()}


class SpikeTracker:
    """Incremental prefill-spike finder (used live by the risk model and offline here)."""

    def __init__(self) -> None:
        self.baseline_bytes: int | None = None
        self.largest_bytes = 0
        self._peak: int | None = None
        self._peak_ts = 0.0

    def update(self, ts_s: float, phase: Phase, allocated: int) -> Spike | None:
        """Feed one allocator reading; returns the spike when a prefill episode ends."""
        peak, base = self._peak, self.baseline_bytes
        self.observe(ts_s, phase, allocated)
        if phase is Phase.PREFILL or peak is None or base is None:
            return None
        return Spike(self._peak_ts, max(0, peak - base), peak, base)

    def observe(self, ts_s: float, phase: Phase, allocated: int) -> int:
        """``update`` without building the :class:`Spike` (the risk model's per-sample path);
        returns the largest request so far: in prefill the episode's spike so far, else the
        largest finished spike."""
        if phase is Phase.PREFILL:
            if self._peak is None or allocated > self._peak:
                self._peak, self._peak_ts = allocated, ts_s
            base = self.baseline_bytes
            return 0 if base is None or self._peak <= base else self._peak - base
        if self._peak is not None:  # the episode ends
            if self.baseline_bytes is not None and self._peak - self.baseline_bytes > \
                    self.largest_bytes:
                self.largest_bytes = self._peak - self.baseline_bytes
            self._peak = None
        self.baseline_bytes = allocated
        return self.largest_bytes

    def current_bytes(self) -> int:
        """The spike of the episode in progress so far (0 outside prefill)."""
        if self._peak is None or self.baseline_bytes is None:
            return 0
        return max(0, self._peak - self.baseline_bytes)


def prefill_spikes(samples: Iterable[Sample]) -> list[Spike]:
    """Every finished prefill episode with a known baseline, in time order."""
    tracker, out = SpikeTracker(), []
    for s in samples:
        if s.allocated_bytes is None:
            continue
        spike = tracker.update(s.ts_s, s.phase, s.allocated_bytes)
        if spike is not None:
            out.append(spike)
    return out


def peak_phase(samples: Sequence[Sample], start_s: float, end_s: float) -> Phase | None:
    """The phase of the sample with the most allocated memory in ``[start_s, end_s]``."""
    best: Sample | None = None
    best_bytes = 0
    for s in samples:
        allocated = s.allocated_bytes
        in_window = start_s <= s.ts_s <= end_s and allocated is not None
        if in_window and allocated is not None and (best is None or allocated > best_bytes):
            best, best_bytes = s, allocated
    return None if best is None else best.phase
