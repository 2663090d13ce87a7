"""The current phase (prefill / decode / idle) of the whole process, and true per-phase peaks.

The phase is process-wide on purpose: the sampler that tags samples with it runs on its own
thread, where a thread-local or a context variable would always read "unknown". Every
transition is a ``phase`` event that closes the span of the phase that ended. How peaks are
taken without disturbing the server ("observe" mode) or with resets (``use_peak_resets``), and
the phase stamped into torch's memory metadata: docs/hooks.md, "Phases and true per-phase peaks".
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.records import Event, Phase
from vramscope.hooks.sink import RecordSink

if TYPE_CHECKING:
    from vramscope.hooks.allocator import Counters

METADATA_PREFIX = "vramscope.phase="
# Requests remembered as in flight. A server that starts requests and never ends them (a crash
# path, a cancelled request) must not make this grow without end: past the bound the oldest is
# forgotten (counted in ``requests_forgotten()``); post-mortems list at most 100 anyway.
MAX_REQUESTS_IN_FLIGHT = 10_000


class PhasePeak(NamedTuple):
    allocated_bytes: int
    exact: bool


class CounterSource(Protocol):
    """One device's allocator counters (``vramscope.hooks.allocator.AllocatorSource``)."""

    @property
    def device(self) -> int: ...

    def counters(self) -> Counters | None: ...


class PeakTracker:
    """Brackets one device's phase spans with reads of the allocator's peak counter."""

    def __init__(self, source: CounterSource,
                 reset_peak: Callable[[int], None] | None = None) -> None:
        self.source = source
        self.device: int = source.device
        self.reset_peak = reset_peak  # set only in "reset" mode
        self._start_peak = 0
        self._max_seen = 0
        self.process_peak = 0

    def begin(self, counters: Counters | None) -> None:
        # No counters yet (CUDA not initialized) means nothing allocated: zero is exact.
        allocated = counters.allocated if counters else 0
        peak = counters.allocated_peak if counters else 0
        self.process_peak = max(self.process_peak, peak)
        self._max_seen = allocated
        self._start_peak = peak
        if self.reset_peak is not None and counters:
            self.reset_peak(self.device)
            self._start_peak = -1  # after a reset the peak counter is this span's alone

    def end(self, counters: Counters | None) -> PhasePeak | None:
        if not counters:
            return None
        peak = counters.allocated_peak
        self.process_peak = max(self.process_peak, peak)
        if peak > self._start_peak:
            return PhasePeak(peak, True)
        return PhasePeak(max(self._max_seen, counters.allocated), False)

    def note(self, allocated: int) -> None:
        if allocated > self._max_seen:
            self._max_seen = allocated


class _Span:
    __slots__ = ("since_mono_s", "steps", "prefill_tokens", "decode_tokens", "mixed_steps")

    def __init__(self, since_mono_s: float) -> None:
        self.since_mono_s = since_mono_s
        self.steps = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.mixed_steps = 0

    def count(self, prefill_tokens: int, decode_tokens: int) -> None:
        self.steps += 1
        self.prefill_tokens += prefill_tokens
        self.decode_tokens += decode_tokens
        if prefill_tokens and decode_tokens:
            self.mixed_steps += 1


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.phase = Phase.UNKNOWN
        self.sink: RecordSink | None = None
        self.clock: Clock = SYSTEM_CLOCK
        self.trackers: list[PeakTracker] = []
        self.stamp: Callable[[str], None] | None = None
        self.requests: dict[str, float] = {}
        self.requests_forgotten = 0
        self.idle_entries = 0  # times the idle phase was entered: idle-point snapshots key on it
        self.span = _Span(SYSTEM_CLOCK.monotonic_s())
        self.pid = os.getpid()


_STATE = _State()


def configure(*, sink: RecordSink | None = None, clock: Clock | None = None,
              sources: Sequence[CounterSource] = (),
              stamp: Callable[[str], None] | None = None,
              reset_peak: Callable[[int], None] | None = None) -> None:
    """Wire the phase tracker to a sink, a clock and allocator sources (``install`` calls it)."""
    with _STATE.lock:
        _STATE.sink = sink
        _STATE.clock = clock or SYSTEM_CLOCK
        _STATE.stamp = stamp
        _STATE.trackers = [PeakTracker(s, reset_peak) for s in sources]
        for tracker in _STATE.trackers:
            tracker.begin(_safe_counters(tracker.source))
        _STATE.span = _Span(_STATE.clock.monotonic_s())


def reset() -> None:
    """Back to the unconfigured state: unknown phase, no sink, no requests (``uninstall``)."""
    global _STATE
    _STATE = _State()


def active_sink() -> RecordSink | None:
    """The sink ``install()`` (or ``configure``) wired, or None: integrations attached without
    a sink of their own put their records there."""
    return _STATE.sink


def current_phase() -> Phase:
    """The phase now. A plain attribute read: safe and cheap from any thread."""
    return _STATE.phase


def note_allocated(device: int, allocated_bytes: int) -> None:
    """The sampler saw this much allocated; a lower bound for the span's peak."""
    for tracker in _STATE.trackers:
        if tracker.device == device:
            tracker.note(allocated_bytes)


def set_phase(name: str | Phase, request_id: str | None = None, *, prefill_tokens: int = 0,
              decode_tokens: int = 0) -> Phase:
    """Enter ``name`` (one step of it); returns the phase before. Never raises but for a bad name.

    Calling it again with the same phase only counts a step and its tokens: no event, no read.
    """
    new = Phase.parse(name)
    state = _STATE
    with state.lock:
        previous = state.phase
        if new is previous:
            state.span.count(prefill_tokens, decode_tokens)
            return previous
        try:
            _transition(state, previous, new, request_id, prefill_tokens, decode_tokens)
        except Exception:  # never into the server; the phase itself is still switched
            state.phase = new
    return previous


def _transition(state: _State, previous: Phase, new: Phase, request_id: str | None,
                prefill_tokens: int, decode_tokens: int) -> None:
    now_mono = state.clock.monotonic_s()
    ended = state.span
    state.phase = new
    if new is Phase.IDLE:
        state.idle_entries += 1
    state.span = _Span(now_mono)
    state.span.count(prefill_tokens, decode_tokens)
    if state.stamp is not None:
        state.stamp(METADATA_PREFIX + new.value)
    common = {"ended_phase": previous.value,
              "ended_duration_s": round(now_mono - ended.since_mono_s, 6),
              "ended_steps": ended.steps, "ended_prefill_tokens": ended.prefill_tokens,
              "ended_decode_tokens": ended.decode_tokens, "ended_mixed_steps": ended.mixed_steps}
    ts_s = state.clock.time_s()
    events = []
    for tracker in state.trackers:
        counters = _safe_counters(tracker.source)
        peak = tracker.end(counters)
        tracker.begin(counters)
        data = dict(common)
        if peak is not None:
            data["ended_peak_allocated_bytes"] = peak.allocated_bytes
            data["ended_peak_exact"] = peak.exact
        events.append(Event(ts_s, "phase", tracker.device, state.pid, new, request_id, data))
    if not state.trackers:
        events.append(Event(ts_s, "phase", 0, state.pid, new, request_id, common))
    if state.sink is not None:
        for event in events:
            state.sink.put(event)


def _safe_counters(source: CounterSource) -> Counters | None:
    try:
        return source.counters()
    except Exception:
        return None


class phase:  # noqa: N801 - used like a function: ``with phase("prefill"):``
    """``with phase("prefill", request_id="r1"):`` enters a phase and restores the one before.

    With a ``request_id`` not yet in flight, the request starts here and ends at exit
    (``request_start`` / ``request_end`` events), so post-mortems can name it.
    """

    __slots__ = ("_name", "_request_id", "_previous", "_owns_request")

    def __init__(self, name: str | Phase, request_id: str | None = None) -> None:
        self._name = Phase.parse(name)
        self._request_id = request_id
        self._previous = Phase.UNKNOWN
        self._owns_request = False

    def __enter__(self) -> phase:
        rid = self._request_id
        if rid is not None and rid not in _STATE.requests:
            request_started(rid)
            self._owns_request = True
        self._previous = set_phase(self._name, rid)
        return self

    def __exit__(self, *exc: object) -> None:
        set_phase(self._previous, self._request_id)
        if self._owns_request and self._request_id is not None:  # owned: it has an id
            request_finished(self._request_id)


def request_started(request_id: str) -> None:
    """A request is in flight from now (a ``request_start`` event)."""
    _request_event("request_start", str(request_id), start=True)


def request_finished(request_id: str) -> None:
    """A request is done (a ``request_end`` event); unknown ids are ignored."""
    _request_event("request_end", str(request_id), start=False)


def _request_event(name: str, request_id: str, *, start: bool) -> None:
    state = _STATE
    with state.lock:
        if start:
            state.requests[request_id] = state.clock.time_s()
            if len(state.requests) > MAX_REQUESTS_IN_FLIGHT:
                del state.requests[next(iter(state.requests))]
                state.requests_forgotten += 1
        elif state.requests.pop(request_id, None) is None:
            return
        if state.sink is not None:
            state.sink.put(Event(state.clock.time_s(), name, 0, state.pid, state.phase,
                                 request_id))


def requests_forgotten() -> int:
    """Requests dropped from the in-flight set because more than ``MAX_REQUESTS_IN_FLIGHT``
    were open (started and never finished)."""
    return _STATE.requests_forgotten


def idle_entries() -> int:
    """How many times the process entered the idle phase (a new idle point each time)."""
    return _STATE.idle_entries


def requests_in_flight() -> tuple[str, ...]:
    """The requests in flight now, oldest first."""
    with _STATE.lock:
        return tuple(_STATE.requests)


def process_peak_allocated_bytes(device: int = 0) -> int | None:
    """The whole-process allocated peak seen at phase boundaries (meaningful in "reset" mode)."""
    for tracker in _STATE.trackers:
        if tracker.device == device:
            return tracker.process_peak
    return None


def use_peak_resets(enabled: bool, reset_peak: Callable[[int], None] | None = None) -> None:
    """Switch to "reset" mode (exact peaks; the server's ``max_memory_allocated`` is per phase)."""
    if enabled and reset_peak is None:
        import torch  # noqa: PLC0415 - only when asked for

        reset_peak = torch.cuda.reset_peak_memory_stats
    with _STATE.lock:
        for tracker in _STATE.trackers:
            tracker.reset_peak = reset_peak if enabled else None
