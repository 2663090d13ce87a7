"""The OOM observer: at an allocator OOM, a compact ``PostMortem`` of what held the memory.

Registered through ``torch._C._cuda_attach_out_of_memory_observer``. The allocator calls it with
``(device, alloc_size, device_limit, device_free)`` after releasing its lock and before raising
``OutOfMemoryError`` into the server, so what it sees is the memory exactly as it was when the
allocation failed. Torch has no way to detach an observer: ``uninstall`` disables ours instead.

Rules: it never raises (one log line, then silence); at most one post-mortem per
``min_interval_s`` (a server retrying in a loop would otherwise snapshot on every try); the
record is bounded (``MAX_HOLDERS`` holders of ``MAX_FRAMES`` frames, ``MAX_SEGMENTS`` segments);
the snapshot is the segments-only one, never the history dump, unless a snapshot directory is
configured, and only then is the full pickle for ``pytorch.org/memory_viz`` written.

``build_postmortem`` is a pure function of the snapshot's segments, so tests feed recorded ones.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agent.clock import SYSTEM_CLOCK, Clock
from agent.records import Event, Holder, Phase, PostMortem
from hooks.phase import METADATA_PREFIX
from hooks.snapshot import largest_free_in_segment, summarize

log = logging.getLogger("vramscope.hooks")

MAX_HOLDERS = 10
MAX_FRAMES = 8
MAX_SEGMENTS = 64
_INTERNAL_FRAME_MARKERS = ("/torch/", "/site-packages/torch", "<frozen", "??")


def format_frames(frames: Sequence[Mapping[str, Any]], limit: int = MAX_FRAMES) -> tuple[str, ...]:
    """``file:line:function``, innermost first; torch's own frames dropped when others remain."""
    text = [f"{f.get('filename', '?')}:{f.get('line', 0)}:{f.get('name', '?')}" for f in frames]
    own = [t for t in text if not any(m in t for m in _INTERNAL_FRAME_MARKERS)]
    return tuple((own or text)[:limit])


def _phase_from_metadata(block: Mapping[str, Any]) -> Phase | None:
    meta = block.get("user_metadata") or ""
    if isinstance(meta, str) and meta.startswith(METADATA_PREFIX):
        try:
            return Phase.parse(meta[len(METADATA_PREFIX):])
        except ValueError:
            return None
    return None


def top_holders(segments: Iterable[Mapping[str, Any]], device: int | None = None,
                limit: int = MAX_HOLDERS) -> tuple[Holder, ...]:
    """The largest live allocations, with their frames when allocation history was on."""
    blocks = [b for s in segments if device is None or s.get("device", device) == device
              for b in s.get("blocks", ()) if b["state"] == "active_allocated"]
    blocks.sort(key=lambda b: int(b["size"]), reverse=True)
    return tuple(Holder(int(b["size"]), format_frames(b.get("frames") or ()),
                        _phase_from_metadata(b)) for b in blocks[:limit])


def segment_map(segments: Iterable[Mapping[str, Any]], device: int | None = None,
                limit: int = MAX_SEGMENTS) -> tuple[dict[str, Any], ...]:
    """The largest segments: address, size, what is allocated and the largest hole in each."""
    mine = [s for s in segments if device is None or s.get("device", device) == device]
    mine.sort(key=lambda s: int(s["total_size"]), reverse=True)
    return tuple({"address": int(s.get("address", 0)), "total_size_bytes": int(s["total_size"]),
                  "allocated_bytes": int(s.get("allocated_size", 0)),
                  "largest_free_block_bytes": largest_free_in_segment(s),
                  "segment_type": s.get("segment_type")} for s in mine[:limit])


def build_postmortem(segments: Sequence[Mapping[str, Any]], *, ts_s: float, device: int,
                     pid: int | None, phase: Phase, failed_alloc_bytes: int | None,
                     driver_free_bytes: int | None, device_total_bytes: int | None,
                     allocated_bytes: int | None = None, reserved_bytes: int | None = None,
                     requests_in_flight: Sequence[str] = (),
                     snapshot_path: str | None = None) -> PostMortem:
    """A bounded post-mortem from a snapshot's segments; counters default to the snapshot's."""
    frag = summarize(segments, device)
    message = oom_message(device, failed_alloc_bytes, driver_free_bytes, device_total_bytes,
                          frag.largest_free_block_bytes)
    return PostMortem(
        ts_s=ts_s, device=device, pid=pid, phase=phase, failed_alloc_bytes=failed_alloc_bytes,
        driver_free_bytes=driver_free_bytes, device_total_bytes=device_total_bytes,
        allocated_bytes=frag.allocated_bytes if allocated_bytes is None else allocated_bytes,
        reserved_bytes=frag.reserved_bytes if reserved_bytes is None else reserved_bytes,
        largest_free_block_bytes=frag.largest_free_block_bytes,
        external_fragmentation_ratio=frag.external_fragmentation_ratio,
        requests_in_flight=tuple(requests_in_flight)[:MAX_HOLDERS * 10],
        top_holders=top_holders(segments, device), segments=segment_map(segments, device),
        message=message, snapshot_path=snapshot_path)


def oom_message(device: int, failed: int | None, free: int | None, limit: int | None,
                largest_free: int) -> str:
    return (f"CUDA out of memory on cuda:{device}: tried to allocate {failed} bytes; "
            f"driver free {free} bytes of limit {limit}; largest free block in reserved "
            f"{largest_free} bytes")


class OomObserver:
    """The callable torch calls at an OOM. Never raises; rate-limited; disabled, not detached."""

    def __init__(self, sink: Any, *, take_segments: Callable[[], list[dict[str, Any]]],
                 read_counters: Callable[[int], Any] | None = None,
                 dump_snapshot: Callable[[str], None] | None = None, snapshot_dir: str = "",
                 min_interval_s: float = 60.0, clock: Clock = SYSTEM_CLOCK) -> None:
        self.sink = sink
        self.enabled = True
        self._take_segments = take_segments
        self._read_counters = read_counters
        self._dump_snapshot = dump_snapshot
        self._snapshot_dir = snapshot_dir
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._last_mono_s: float | None = None
        self._pid = os.getpid()
        self.seen = 0
        self.suppressed = 0
        self.failures = 0

    def __call__(self, device: int, alloc_size: int, device_limit: int, device_free: int,
                 *_: Any) -> None:
        if not self.enabled:
            return
        self.seen += 1
        now = self._clock.monotonic_s()
        if self._last_mono_s is not None and now - self._last_mono_s < self._min_interval_s:
            self.suppressed += 1
            return
        self._last_mono_s = now
        try:
            self._record(int(device), int(alloc_size), int(device_limit), int(device_free))
        except Exception as exc:  # the server is already failing; never make it worse
            self.failures += 1
            if self.failures == 1:
                log.warning("vramscope: building the OOM post-mortem failed: %r", exc)

    def _record(self, device: int, alloc: int, limit: int, free: int) -> None:
        from hooks.phase import current_phase, requests_in_flight

        counters = self._read_counters(device) if self._read_counters else None
        ts_s = self._clock.time_s()
        path = self._maybe_dump(ts_s)
        pm = build_postmortem(
            self._take_segments(), ts_s=ts_s, device=device, pid=self._pid,
            phase=current_phase(), failed_alloc_bytes=alloc, driver_free_bytes=free,
            device_total_bytes=limit,
            allocated_bytes=counters.allocated if counters else None,
            reserved_bytes=counters.reserved if counters else None,
            requests_in_flight=requests_in_flight(), snapshot_path=path)
        self.sink.put(pm)
        self.sink.put(Event(ts_s, "oom", device, self._pid, pm.phase, None,
                            {"message": pm.message, "failed_alloc_bytes": alloc}))

    def _maybe_dump(self, ts_s: float) -> str | None:
        if not self._snapshot_dir or self._dump_snapshot is None:
            return None
        try:
            os.makedirs(self._snapshot_dir, exist_ok=True)
            path = os.path.join(self._snapshot_dir, f"oom-{self._pid}-{int(ts_s * 1000)}.pickle")
            self._dump_snapshot(path)
            return path
        except Exception as exc:
            log.warning("vramscope: could not write the OOM snapshot to %s: %r "
                        "(set hooks.snapshot_dir to a writable directory)", self._snapshot_dir, exc)
            return None
