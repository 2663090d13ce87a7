"""Fragmentation from an allocator snapshot: largest free block, external fragmentation, waste.

Pure functions over the snapshot's segment dicts, split as ``torch/cuda/_memory_viz.py``'s
``segsum`` does (docs/hooks.md, "Fragmentation snapshots"). ``SnapshotSource`` takes the lightest
snapshot the installed torch offers and spaces them out when one costs more than allowed.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.records import Event, Sample
from vramscope.hooks.sink import Record

log = logging.getLogger("vramscope.hooks")

MAX_BACKOFF_S = 3600.0


class Fragmentation(NamedTuple):
    segments: int
    reserved_bytes: int
    allocated_bytes: int  # sum of block sizes in use (what the allocator counts)
    requested_bytes: int  # what those allocations asked for
    internal_waste_bytes: int  # allocated - requested (rounding)
    free_external_bytes: int  # inactive + awaiting-free blocks, as segsum counts them
    free_inactive_bytes: int  # inactive blocks only: reusable now
    largest_free_block_bytes: int
    external_fragmentation_ratio: float | None


def summarize(segments: Iterable[Mapping[str, Any]], device: int | None = None) -> Fragmentation:
    """The fragmentation picture of the segments (of one device when ``device`` is given)."""
    n = reserved = allocated = requested = external = inactive = largest = 0
    for seg in segments:
        if device is not None and seg.get("device", device) != device:
            continue
        n += 1
        reserved += int(seg["total_size"])
        for block in seg.get("blocks", ()):
            size = int(block["size"])
            if block["state"] == "active_allocated":
                allocated += size
                requested += int(block.get("requested_size", size))
                continue
            external += size
            if block["state"] == "inactive":
                inactive += size
                largest = max(largest, size)
    ratio = None if inactive == 0 else round(1.0 - largest / inactive, 6)
    return Fragmentation(n, reserved, allocated, requested, allocated - requested, external,
                         inactive, largest, ratio)


def largest_free_in_segment(seg: Mapping[str, Any]) -> int:
    return max((int(b["size"]) for b in seg.get("blocks", ()) if b["state"] == "inactive"),
               default=0)


def light_snapshot_fn(torch: Any) -> Callable[[], list[dict[str, Any]]]:
    """The cheapest segments-only snapshot this torch offers (no trace entries, no history)."""
    snap: Callable[..., list[dict[str, Any]]] = torch.cuda.memory_snapshot
    try:
        takes_traces = "include_traces" in inspect.signature(snap).parameters
    except (TypeError, ValueError):
        takes_traces = False
    if takes_traces:
        return lambda: snap(include_traces=False)
    return snap


class SnapshotSource:
    """At ``interval_s``, a light snapshot becomes a sample (largest free block) and an event.

    The ``snapshot`` event carries ``cost_s``, the fragmentation figures and ``next_interval_s``.
    A snapshot that costs more than ``max_cost_s`` doubles the interval (up to an hour); cheap
    ones bring it back towards the configured interval. ``max_cost_s = 0`` means no limit.
    """

    def __init__(self, device: int, take: Callable[[], list[dict[str, Any]]], *,
                 interval_s: float, max_cost_s: float, clock: Clock = SYSTEM_CLOCK,
                 pid: int | None = None, ready: Callable[[], bool] = lambda: True) -> None:
        if interval_s <= 0:
            raise ValueError(f"snapshot interval must be > 0 s, got {interval_s!r}")
        self.device = device
        self.base_interval_s = interval_s
        self.interval_s = interval_s
        self.start_delay_s = interval_s  # the first snapshot waits one interval, not install()
        self.max_cost_s = max_cost_s
        self._take = take
        self._clock = clock
        # the process's own, as its allocator samples carry: a snapshot without one would be
        # read as the device's (a process of its own, forever warming up, on the leak page)
        self._pid = os.getpid() if pid is None else pid
        self._ready = ready  # False while CUDA is not initialized: a snapshot would create it

    def read(self) -> list[Record] | None:
        if not self._ready():
            return None
        t0 = self._clock.monotonic_s()
        segments = self._take()
        cost_s = self._clock.monotonic_s() - t0
        self._adapt(cost_s)
        frag = summarize(segments, self.device)
        return self._records(frag, cost_s)

    def _adapt(self, cost_s: float) -> None:
        if self.max_cost_s > 0 and cost_s > self.max_cost_s:
            self.interval_s = min(self.interval_s * 2, max(MAX_BACKOFF_S, self.base_interval_s))
        elif self.max_cost_s <= 0 or cost_s < self.max_cost_s / 2:
            self.interval_s = max(self.base_interval_s, self.interval_s / 2)

    def _records(self, frag: Fragmentation, cost_s: float) -> list[Record]:
        from vramscope.hooks.phase import current_phase

        ts_s = self._clock.time_s()
        phase = current_phase()
        sample = Sample(ts_s, self.device, phase, "torch_snapshot", self._pid,
                        largest_free_block_bytes=frag.largest_free_block_bytes)
        data = {"cost_s": round(cost_s, 6), "next_interval_s": self.interval_s,
                "segments": frag.segments, "reserved_bytes": frag.reserved_bytes,
                "free_inactive_bytes": frag.free_inactive_bytes,
                "largest_free_block_bytes": frag.largest_free_block_bytes,
                "external_fragmentation_ratio": frag.external_fragmentation_ratio,
                "internal_waste_bytes": frag.internal_waste_bytes}
        return [sample, Event(ts_s, "snapshot", self.device, self._pid, phase, None, data)]
