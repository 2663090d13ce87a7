"""KV saturation: a pool that is full while requests wait, or that preempts them.

Such a server serves less than it is asked and no memory trend says so. ``kv_saturated`` is 1
while the device's fullest pool is at least ``SATURATION_SHARE`` used with a request waiting, or
a ``kv_preempted`` event came within ``PREEMPTION_WINDOW_S`` (docs/alerts.md, "kv_saturation").
"""

from __future__ import annotations

from collections import deque
from typing import Any

from vramscope.agent.event_kinds import Role, names_with
from vramscope.agent.records import Event

# A pool this full has no room for a waiting request's prompt (vLLM admits a request only when
# its blocks fit): 95 % leaves less than one long prompt's blocks in a pool of a few thousand.
SATURATION_SHARE = 0.95
PREEMPTION_WINDOW_S = 60.0  # a preemption keeps the pool saturated for this long
EVENTS = frozenset(names_with(Role.SATURATION))  # server_load and kv_preempted
# The dashboard's /metrics reads the events of this long back: a server sends server_load only
# when its counts change, so its newest may be minutes old while the queue stands still.
LOAD_WINDOW_S = 600.0


class Saturation:
    """One device's waiting requests and recent preemptions, and the last figures read."""

    def __init__(self) -> None:
        self.load: dict[int | None, tuple[int | None, int]] = {}  # pid -> (running, waiting)
        self._preempted: deque[tuple[float, int]] = deque()  # (time, count), oldest first
        self.figures: dict[str, Any] = {}  # the last evaluation's numbers, for the message

    def on_event(self, e: Event) -> bool:
        """Take a ``server_load`` or ``kv_preempted`` event; True when it changed anything."""
        data = e.data or {}
        if e.name == "server_load":
            waiting, running = data.get("waiting"), data.get("running")
            if not isinstance(waiting, int) or not _count(waiting):
                return self.load.pop(e.pid, None) is not None  # no queue reading: forget it
            self.load[e.pid] = (running if isinstance(running, int) and _count(running)
                                else None, waiting)
            return True
        if e.name == "kv_preempted":
            count = data.get("count", 1)
            if _count(count) and count > 0:
                self._preempted.append((e.ts_s, count))
                return True
        return False

    def preemptions(self, now_s: float) -> int:
        preempted = self._preempted
        if not preempted:
            return 0  # the common case: read on every KV sample
        while preempted and now_s - preempted[0][0] >= PREEMPTION_WINDOW_S:
            preempted.popleft()
        return sum(count for _, count in preempted)

    def value(self, usage_ratio: float | None, blocks_total: int | None,
              now_s: float) -> float | None:
        """``kv_saturated`` now (None before any pool, queue or preemption was seen)."""
        preempted = self.preemptions(now_s)
        load = self.load
        waiting = sum(w for _, w in load.values()) if load else None
        if usage_ratio is None and waiting is None and not preempted:
            return None
        running = [r for r, _ in load.values() if r is not None] if load else None
        self.figures = {"usage_ratio": usage_ratio, "blocks": blocks_total, "waiting": waiting,
                        "running": sum(running) if running else None, "preempted": preempted}
        full = usage_ratio is not None and usage_ratio >= SATURATION_SHARE and (waiting or 0) >= 1
        return 1.0 if full or preempted else 0.0

    def message(self, text: str) -> str:
        """``text`` with the figures: "KV pool saturated: 100.0 % of 63 blocks used, 12
        requests waiting (4 running), 58 preemptions in the last 60 s"."""
        f = self.figures
        parts = []
        if f.get("usage_ratio") is not None:
            blocks = f.get("blocks")
            of = f" of {blocks} blocks" if blocks else ""
            parts.append(f"{f['usage_ratio'] * 100:.1f} %{of} used")
        if f.get("waiting") is not None:
            running = "" if f.get("running") is None else f" ({f['running']} running)"
            parts.append(f"{f['waiting']} request{'s' * (f['waiting'] != 1)} waiting{running}")
        parts.append(f"{f.get('preempted', 0)} preemption{'s' * (f.get('preempted') != 1)} in "
                     f"the last {PREEMPTION_WINDOW_S:.0f} s")
        return f"{text}: {', '.join(parts)}"


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
