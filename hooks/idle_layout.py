"""The allocator's layout at idle points: what a leak's make-up is computed from.

``IdleLayoutSource`` takes the light snapshot (segments only) when the phase enters ``idle`` and
puts a ``memory_layout`` event, a bounded summary of the segments and live blocks (its fields:
docs/trace-format.md, "memory_layout"; the bounds keep it under ``MAX_EVENT_BYTES``, since the
ingest refuses event data over 64 KiB and with it the client's batch). At most one per
``min_interval_s``, doubled while one costs more than ``max_cost_s``. ``layout_summary`` is a
pure function of the segments; ``vramscope.agent.analysis.makeup`` diffs two of them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.records import Event, Phase
from vramscope.hooks.oom import _phase_from_metadata, format_frames
from vramscope.hooks.snapshot import MAX_BACKOFF_S

LAYOUT_EVENT = "memory_layout"
# the keys of a block without a phase stamp (``Block`` in torch.cuda.memory._snapshot's docstring)
_PLAIN_BLOCK = frozenset({"address", "size", "requested_size", "state", "frames"})
_KEY_FRAMES = 24  # frames that tell two stacks apart (their first four own frames are kept)
MAX_GROUPS = 256
MAX_STACKS = 32
MAX_FRAMES = 4
MAX_FRAME_CHARS = 160
MAX_EVENT_BYTES = 56_000  # under the ingest's 64 KiB per event's data, with room to spare


def cublas_workspace_bytes(config: str | None) -> int | None:
    """Bytes of one cuBLAS workspace as ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KiB:COUNT`` pairs,
    e.g. ``:4096:8`` = 32 MiB) asks for; None when unset or not in that form."""
    if not config:
        return None
    parts = config.strip().strip(":").split(":")
    if len(parts) % 2 or not all(p.isdigit() for p in parts):
        return None
    return sum(int(size) * 1024 * int(count) for size, count in zip(parts[::2], parts[1::2]))


def layout_summary(segments: Iterable[Mapping[str, Any]], device: int | None = None, *,
                   workspace_bytes: int | None = None) -> dict[str, Any]:
    """The ``memory_layout`` data of the segments (of one device when ``device`` is given)."""
    seg_groups: dict[tuple[int, int], list[int]] = {}
    stacks_seen: dict[tuple[Any, ...], tuple[str, ...]] = {}
    block_groups: dict[tuple[int, int, str | None, tuple[str, ...]], int] = {}
    n = reserved = allocated = 0
    for seg in segments:
        if device is not None and seg.get("device", device) != device:
            continue
        size, stream = int(seg["total_size"]), int(seg.get("stream") or 0)
        n += 1
        reserved += size
        group = seg_groups.setdefault((size, stream), [0, 0])
        group[0] += 1
        for block in seg.get("blocks", ()):
            if block["state"] != "active_allocated":
                continue
            bsize = int(block["size"])
            allocated += bsize
            group[1] += bsize
            phase = None if block.keys() <= _PLAIN_BLOCK else _phase_from_metadata(block)
            frames = block.get("frames")
            stack = _stack_of(frames, stacks_seen) if frames else ()
            key = (bsize, stream, phase.value if phase else None, stack)
            block_groups[key] = block_groups.get(key, 0) + 1
    segs, seg_dropped = _largest([[s, st, c, a] for (s, st), (c, a) in seg_groups.items()],
                                 lambda g: g[0] * g[2])
    blocks, blk_dropped = _largest([[*k, c] for k, c in block_groups.items()],
                                   lambda g: g[0] * g[4])
    stacks: dict[tuple[str, ...], int] = {}
    rows = [[size, stream, count, phase, _stack_index(stacks, stack)]
            for size, stream, phase, stack, count in blocks]
    return _fit({"segments": n, "reserved_bytes": reserved, "allocated_bytes": allocated,
                 "segment_groups": segs, "block_groups": rows,
                 "stacks": [list(s) for s in stacks],
                 "dropped_groups": seg_dropped[0] + blk_dropped[0],
                 "dropped_bytes": blk_dropped[1],
                 "cublas_workspace_bytes": workspace_bytes})


def _fit(data: dict[str, Any]) -> dict[str, Any]:
    """Within ``MAX_EVENT_BYTES``: the bounds above keep it there for any sane numbers; should
    they not, the stacks go first, then the lightest half of the groups, counted as dropped."""
    while len(json.dumps(data, separators=(",", ":"))) > MAX_EVENT_BYTES:
        if data["stacks"]:
            data["stacks"] = []
            data["block_groups"] = [[*g[:4], None] for g in data["block_groups"]]
            continue
        for key in ("segment_groups", "block_groups"):
            groups = data[key]
            keep = len(groups) // 2
            data["dropped_groups"] += len(groups) - keep
            if key == "block_groups":
                data["dropped_bytes"] += sum(g[0] * g[2] for g in groups[keep:])
            data[key] = groups[:keep]
    return data


def _stack_of(frames: list[Mapping[str, Any]],
              seen: dict[tuple[Any, ...], tuple[str, ...]]) -> tuple[str, ...]:
    """The formatted stack, formatted once per distinct frame list (many blocks share one: a
    snapshot of 30k blocks costs a tuple per block, not a string per frame). Lists alike in
    their first ``_KEY_FRAMES`` frames share a stack."""
    # by identity: torch builds each distinct frame dict once per snapshot and shares it among
    # the tracebacks that have it; the snapshot is alive for the whole summary, so ids are too
    key = tuple(map(id, frames[:_KEY_FRAMES]))
    stack = seen.get(key)
    if stack is None:
        stack = seen[key] = tuple(f[-MAX_FRAME_CHARS:]
                                  for f in format_frames(frames, MAX_FRAMES))
    return stack


def _largest(groups: list[list[Any]], weight: Callable[[list[Any]], int],
             ) -> tuple[list[list[Any]], tuple[int, int]]:
    """The ``MAX_GROUPS`` heaviest groups (ties in a stable order), and (count, bytes) left out."""
    groups.sort(key=lambda g: (-weight(g), g[0], g[1]))
    left = groups[MAX_GROUPS:]
    return groups[:MAX_GROUPS], (len(left), sum(weight(g) for g in left))


def _stack_index(stacks: dict[tuple[str, ...], int], stack: tuple[str, ...]) -> int | None:
    """The stack's index in the event's ``stacks`` (None: no frames, or past ``MAX_STACKS``)."""
    if not stack:
        return None
    if stack not in stacks and len(stacks) < MAX_STACKS:
        stacks[stack] = len(stacks)
    return stacks.get(stack)


class IdleLayoutSource:
    """A sampler task: at each new idle point, at most once per ``min_interval_s``, one
    ``memory_layout`` event. ``read()`` costs two attribute reads when there is nothing to do."""

    def __init__(self, device: int, take: Callable[[], list[dict[str, Any]]], *,
                 min_interval_s: float, poll_s: float = 0.1, max_cost_s: float = 0.0,
                 clock: Clock = SYSTEM_CLOCK, pid: int | None = None,
                 ready: Callable[[], bool] = lambda: True,
                 idle_entries: Callable[[], int] | None = None,
                 phase_fn: Callable[[], Phase] | None = None,
                 workspace_bytes: int | None = None) -> None:
        if min_interval_s <= 0 or poll_s <= 0:
            raise ValueError(f"idle layout intervals must be > 0 s, got min_interval_s="
                             f"{min_interval_s!r}, poll_s={poll_s!r}")
        from vramscope.hooks import phase as phase_mod

        self.device = device
        self.interval_s = poll_s  # how often the sampler asks; the work is rarer
        self.base_min_interval_s = self.min_interval_s = min_interval_s
        self.max_cost_s = max_cost_s
        self._take = take
        self._clock = clock
        self._pid = os.getpid() if pid is None else pid
        self._ready = ready  # False while CUDA is not initialized: a snapshot would create it
        self._idle_entries = idle_entries or phase_mod.idle_entries
        self._phase = phase_fn or phase_mod.current_phase
        self._workspace_bytes = workspace_bytes
        self._done_entry = 0  # the idle point last summarized (0: none yet)
        self._last_mono_s: float | None = None

    def read(self) -> Event | None:
        entry = self._idle_entries()
        if entry == self._done_entry or self._phase() is not Phase.IDLE:
            return None
        now_s = self._clock.monotonic_s()
        if self._last_mono_s is not None and now_s - self._last_mono_s < self.min_interval_s:
            return None  # this idle point is skipped; a later one is taken
        if not self._ready():
            return None
        self._done_entry, self._last_mono_s = entry, now_s
        segments = self._take()
        data = layout_summary(segments, self.device, workspace_bytes=self._workspace_bytes)
        del segments  # the snapshot is large: gone before the event is handed on
        cost_s = self._clock.monotonic_s() - now_s
        self._adapt(cost_s)
        data["cost_s"] = round(cost_s, 6)
        return Event(self._clock.time_s(), LAYOUT_EVENT, self.device, self._pid, Phase.IDLE,
                     None, data)

    def _adapt(self, cost_s: float) -> None:
        if self.max_cost_s > 0 and cost_s > self.max_cost_s:
            self.min_interval_s = min(self.min_interval_s * 2,
                                      max(MAX_BACKOFF_S, self.base_min_interval_s))
        elif self.max_cost_s <= 0 or cost_s < self.max_cost_s / 2:
            self.min_interval_s = max(self.base_min_interval_s, self.min_interval_s / 2)
