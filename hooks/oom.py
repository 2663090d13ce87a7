"""The OOM observer: at an allocator OOM, a compact ``PostMortem`` of what held the memory.

Attached with ``torch._C._cuda_attach_out_of_memory_observer``, it runs before
``OutOfMemoryError`` is raised, so it sees memory as it was at the failure; torch cannot detach
it, so ``uninstall`` disables ours. It never raises, is rate-limited and bounded (docs/hooks.md,
"OOM post-mortem"); ``build_postmortem`` is pure, so tests feed recorded segments.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.records import Event, Holder, Phase, PostMortem
from vramscope.hooks.phase import METADATA_PREFIX
from vramscope.hooks.sink import RecordSink
from vramscope.hooks.snapshot import largest_free_in_segment, summarize

if TYPE_CHECKING:
    from vramscope.hooks.allocator import Counters

log = logging.getLogger("vramscope.hooks")

MAX_HOLDERS = 10
MAX_FRAMES = 8
MAX_SEGMENTS = 64
# torch's own frames; not a bare "/torch/": virtualenvs live in paths like /opt/torch/.venv
_INTERNAL_FRAME_MARKERS = ("/site-packages/torch/", "/dist-packages/torch/", "<frozen", "??")


def format_frames(frames: Sequence[Mapping[str, Any]], limit: int = MAX_FRAMES) -> tuple[str, ...]:
    """``file:line:function``, innermost first; torch's own frames dropped when others remain."""
    text = [f"{f.get('filename', '?')}:{f.get('line', 0)}:{f.get('name', '?')}" for f in frames]
    own = [t for t in text if not any(m in t for m in _INTERNAL_FRAME_MARKERS)]
    return tuple((own or text)[:limit])


def _phase_from_metadata(block: Mapping[str, Any]) -> Phase | None:
    """The phase stamped by ``_set_memory_metadata``, in whichever key this torch keeps it."""
    for value in block.values():
        if isinstance(value, str) and value.startswith(METADATA_PREFIX):
            try:
                return Phase.parse(value[len(METADATA_PREFIX):])
            except ValueError:
                return None
    return None


def phases_by_address(trace_entries: Iterable[Mapping[str, Any]]) -> dict[int, Phase]:
    """Address -> phase stamped on its latest ``alloc`` history entry (torch 2.11 keeps
    ``user_metadata`` on trace entries, not on blocks)."""
    out: dict[int, Phase] = {}
    for entry in trace_entries:
        if entry.get("action") == "alloc":
            found = _phase_from_metadata(entry)
            if found is not None:
                out[int(entry["addr"])] = found
            else:
                out.pop(int(entry.get("addr", -1)), None)
    return out


def top_holders(segments: Iterable[Mapping[str, Any]], device: int | None = None,
                limit: int = MAX_HOLDERS,
                trace_entries: Iterable[Mapping[str, Any]] = ()) -> tuple[Holder, ...]:
    """The largest live allocations, with their frames when allocation history was on and
    their phase when the block or its history entry carries the stamp."""
    blocks = [b for s in segments if device is None or s.get("device", device) == device
              for b in s.get("blocks", ()) if b["state"] == "active_allocated"]
    blocks.sort(key=lambda b: int(b["size"]), reverse=True)
    stamped = phases_by_address(trace_entries)
    return tuple(Holder(int(b["size"]), format_frames(b.get("frames") or ()),
                        _phase_from_metadata(b) or stamped.get(int(b.get("address", -1))))
                 for b in blocks[:limit])


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
                     snapshot_path: str | None = None,
                     trace_entries: Iterable[Mapping[str, Any]] = ()) -> PostMortem:
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
        top_holders=top_holders(segments, device, trace_entries=trace_entries),
        segments=segment_map(segments, device),
        message=message, snapshot_path=snapshot_path)


def oom_message(device: int, failed: int | None, free: int | None, limit: int | None,
                largest_free: int) -> str:
    return (f"CUDA out of memory on cuda:{device}: tried to allocate {failed} bytes; "
            f"driver free {free} bytes of limit {limit}; largest free block in reserved "
            f"{largest_free} bytes")


class OomObserver:
    """The callable torch calls at an OOM. Never raises; rate-limited; disabled, not detached."""

    def __init__(self, sink: RecordSink, *, take_segments: Callable[[], list[dict[str, Any]]],
                 read_counters: Callable[[int], Counters | None] | None = None,
                 full_snapshot: Callable[[], dict[str, Any]] | None = None,
                 snapshot_dir: str = "",
                 min_interval_s: float = 60.0, clock: Clock = SYSTEM_CLOCK) -> None:
        self.sink = sink
        self.enabled = True
        self._take_segments = take_segments
        self._read_counters = read_counters
        self._full_snapshot = full_snapshot
        self._snapshot_dir = snapshot_dir
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._last_mono_s: float | None = None
        self._pid = os.getpid()
        self.seen = 0
        self.suppressed = 0
        self.failures = 0

    def __call__(self, device: int, alloc_size: int, device_limit: int, device_free: int,
                 *_: object) -> None:
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
            if self.failures == 1:  # the text only: a record holding exc would hold its frames
                log.warning("vramscope: building the OOM post-mortem failed: %s", repr(exc))

    def _record(self, device: int, alloc: int, limit: int, free: int) -> None:
        from vramscope.hooks.phase import current_phase, requests_in_flight

        counters = self._read_counters(device) if self._read_counters else None
        ts_s = self._clock.time_s()
        path, full = self._maybe_dump(ts_s)
        segments = full["segments"] if full else self._take_segments()
        traces = full.get("device_traces") or [] if full else []
        pm = build_postmortem(
            segments, ts_s=ts_s, device=device, pid=self._pid,
            phase=current_phase(), failed_alloc_bytes=alloc, driver_free_bytes=free,
            device_total_bytes=limit,
            allocated_bytes=counters.allocated if counters else None,
            reserved_bytes=counters.reserved if counters else None,
            requests_in_flight=requests_in_flight(), snapshot_path=path,
            trace_entries=traces[device] if device < len(traces) else ())
        self.sink.put(pm)
        self.sink.put(Event(ts_s, "oom", device, self._pid, pm.phase, None,
                            {"message": pm.message, "failed_alloc_bytes": alloc}))

    def _maybe_dump(self, ts_s: float) -> tuple[str | None, dict[str, Any] | None]:
        """The full snapshot (with history) pickled for memory_viz, only when configured."""
        if not self._snapshot_dir or self._full_snapshot is None:
            return None, None
        full = path = None
        try:
            full = self._full_snapshot()
            os.makedirs(self._snapshot_dir, exist_ok=True)
            path = os.path.join(self._snapshot_dir, f"oom-{self._pid}-{int(ts_s * 1000)}.pickle")
            with open(path, "wb") as fh:
                pickle.dump(full, fh)
            return path, full
        except Exception as exc:
            # The text only: a log record holding exc would hold its traceback, whose frames
            # hold the snapshot (a handler that keeps records would keep gigabytes of dicts).
            log.warning("vramscope: could not write the OOM snapshot to %s: %s "
                        "(set hooks.snapshot_dir to a writable directory)", self._snapshot_dir,
                        repr(exc))
            if path is not None:
                with contextlib.suppress(OSError):
                    os.remove(path)  # half a pickle is no snapshot
            return None, full
