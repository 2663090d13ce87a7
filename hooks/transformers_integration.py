"""``vramscope.attach_transformers(model)``: phases for transformers models, with no user code.

Hook points, read in transformers 5.17 and 5.24, each guarded so that a missing one turns that
part off instead of failing: ``model.generate`` (with a forward pre-hook tagging prefill and
decode passes) and continuous batching (``init_continuous_batching`` → the manager's
``_create_batch_processor`` → its ``scheduler.schedule_batch`` and ``finish_request``). What
each reads and which phase and token counts it records: docs/hooks.md, "transformers".
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vramscope.agent.records import Phase
from vramscope.hooks import phase as phase_mod
from vramscope.hooks.generate_kv import GenerateTokens
from vramscope.hooks.sink import RecordSink
from vramscope.hooks.transformers_kv import observe_paged_attention_cache, weak_method

# The model, its manager, processor, scheduler and their results stay ``Any``: transformers'
# internals, found by name (hasattr) because they change between versions.
log = logging.getLogger("vramscope.hooks")
_REQUEST_IDS = itertools.count(1)
_MARK = "_vramscope_instrumented"


def statuses_before(scheduler: Any) -> dict[str, str]:
    """Status names of the active requests, read just before a step is scheduled."""
    active = getattr(scheduler, "active_requests", None) or {}
    return {str(rid): getattr(getattr(st, "status", None), "name", "") for rid, st in
            list(active.items())}


def classify_step(scheduled: Iterable[Any] | None,
                  before: Mapping[str, str]) -> tuple[Phase, int, int, list[str]]:
    """(phase, prefill tokens, decode tokens, ids of prefilling requests) of one packed step.

    ``scheduled`` is what ``Scheduler.schedule_batch`` returned: ``FutureRequestState`` objects
    (5.24, with ``.state`` and ``.query_length``) or ``RequestState`` objects (older releases).
    ``before`` maps request ids to their status *before* scheduling: 5.24 already marks a
    request DECODING when its last prefill chunk is scheduled, so the status after says nothing
    about the step being built. A request that was not active (waiting, ``PENDING``) or was
    still prefilling brings prefill tokens; one that was ``DECODING`` brings decode tokens.
    """
    prefill = decode = 0
    prefilling: list[str] = []
    for item in scheduled or ():
        state = getattr(item, "state", item)
        tokens = getattr(item, "query_length", None)
        if tokens is None:
            tokens = len(getattr(state, "tokens_to_process", None) or ()) or 1
        rid = str(getattr(state, "request_id", ""))
        if before.get(rid, "PENDING") == "DECODING":
            decode += int(tokens)
        else:
            prefill += int(tokens)
            prefilling.append(rid)
    if prefill:
        return Phase.PREFILL, prefill, decode, prefilling
    return (Phase.DECODE if decode else Phase.IDLE), 0, decode, prefilling


class TransformersHandle:
    """What ``attach_transformers`` hooked; ``detach()`` undoes it. ``hooks`` names each part."""

    def __init__(self, model: Any, sink: RecordSink | None,
                 kv_sample_interval_s: float = 0.5) -> None:
        self.model = model
        self.sink = sink
        # the KV tokens generate()'s calls hold (their per-request caches)
        self.kv_tokens = GenerateTokens(self._sink, _device_index(model), kv_sample_interval_s,
                                        phase_mod.current_phase)
        self.hooks: list[str] = []
        self.missing: list[str] = []
        self.steps = 0
        # Undo steps for the model (long-lived, patched once per attach); objects that one
        # call creates (manager, scheduler) are patched through ``_per_call``, held weakly.
        self._undo: list[Callable[[], None]] = []
        self._per_call = PerCallPatches()
        self._local = threading.local()
        # Requests whose start was put, until their end; bounded like phase's in-flight set (a
        # call that raised mid-way never finishes its requests).
        self._seen_requests: dict[str, None] = {}

    def _sink(self) -> RecordSink | None:
        return self.sink if self.sink is not None else phase_mod.active_sink()

    def detach(self) -> None:
        self._per_call.restore_all()
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as exc:
                log.warning("vramscope: detaching a transformers hook failed: %s", repr(exc))
        self.hooks.clear()

    # -- generate() ------------------------------------------------------------------------
    def _generate_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def generate(*args: Any, **kwargs: Any) -> Any:
            rid = f"generate-{next(_REQUEST_IDS)}"
            local = self._local
            outer = getattr(local, "request_id", None)
            local.request_id, local.pending_prefill = rid, True
            phase_mod.request_started(rid)
            try:
                return original(*args, **kwargs)
            finally:
                local.request_id, local.pending_prefill = outer, False
                _guarded(self.kv_tokens.finished, rid)
                _guarded(phase_mod.request_finished, rid)
                # idle only when no other thread's request is still in flight: a server
                # answering requests from several threads is not idle between two of them
                if outer is None and not phase_mod.requests_in_flight():
                    _guarded(phase_mod.set_phase, Phase.IDLE)
        generate.__wrapped__ = original  # type: ignore[attr-defined]
        return generate

    def _forward_pre_hook(self, module: Any, args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> None:
        local = self._local
        rid = getattr(local, "request_id", None)
        if rid is None:
            return None  # a forward outside generate(): continuous batching tags its own
        try:
            rows, length = _input_shape(args, kwargs)
            self.steps += 1
            if local.pending_prefill:
                local.pending_prefill = False
                phase_mod.set_phase(Phase.PREFILL, rid, prefill_tokens=rows * length)
            else:
                phase_mod.set_phase(Phase.DECODE, rid, decode_tokens=rows)
            self.kv_tokens.forward(rid, rows, length, kwargs.get("past_key_values"))
        except Exception:
            pass  # never into the model's forward
        return None

    # -- continuous batching ------------------------------------------------------------------
    def _init_cb_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def init_continuous_batching(*args: Any, **kwargs: Any) -> Any:
            # Until the first scheduled step the manager allocates its KV pool and warms up:
            # setup, not idle (a 120 GB "idle" peak otherwise) and not a request's prefill.
            if phase_mod.current_phase() in (Phase.IDLE, Phase.UNKNOWN):
                _guarded(phase_mod.set_phase, Phase.SETUP)
            manager = original(*args, **kwargs)
            _guarded(self._instrument_manager, manager)
            return manager
        init_continuous_batching.__wrapped__ = original  # type: ignore[attr-defined]
        return init_continuous_batching

    def _instrument_manager(self, manager: Any) -> None:
        if getattr(manager, _MARK, False):
            return
        if getattr(manager, "_create_batch_processor", None) is None:
            self._missing("ContinuousBatchingManager._create_batch_processor")
            return

        def after_create(_manager: Any, processor: Any, *_: Any, **__: Any) -> None:
            _guarded(self._instrument_processor, processor)

        self._per_call.wrap(manager, "_create_batch_processor", after=after_create)
        setattr(manager, _MARK, True)
        existing = getattr(manager, "batch_processor", None)
        if existing is not None:
            self._instrument_processor(existing)

    def _instrument_processor(self, processor: Any) -> None:
        scheduler = getattr(processor, "scheduler", None)
        if scheduler is not None and not getattr(scheduler, _MARK, False):
            self._instrument_scheduler(scheduler)
        cache = getattr(processor, "cache", None)
        if cache is not None and not getattr(cache, _MARK, False):
            setattr(cache, _MARK, True)
            self._observe_kv(cache)

    def _instrument_scheduler(self, scheduler: Any) -> None:
        if getattr(scheduler, "schedule_batch", None) is None:
            self._missing("Scheduler.schedule_batch")
            return

        def before_schedule(sched: Any, *_: Any, **__: Any) -> dict[str, str]:
            return statuses_before(sched)

        def after_schedule(_sched: Any, result: Any, before: Mapping[str, str], *_: Any,
                           **__: Any) -> None:
            _guarded(self._tag_step, result, before)

        self._per_call.wrap(scheduler, "schedule_batch", before=before_schedule,
                            after=after_schedule)
        if getattr(scheduler, "finish_request", None) is not None:
            def after_finish(sched: Any, _out: Any, _before: Any, request_id: Any, *_: Any,
                             **__: Any) -> None:
                _guarded(self._request_done, sched, str(request_id))

            self._per_call.wrap(scheduler, "finish_request", after=after_finish)
        setattr(scheduler, _MARK, True)
        self._hooked("continuous_batching")

    def _tag_step(self, result: Any, before: Mapping[str, str]) -> None:
        scheduled = result[0] if isinstance(result, tuple) else result
        phase, prefill, decode, prefilling = classify_step(scheduled, before)
        for rid in prefilling:
            if rid not in self._seen_requests:
                self._seen_requests[rid] = None
                if len(self._seen_requests) > phase_mod.MAX_REQUESTS_IN_FLIGHT:
                    del self._seen_requests[next(iter(self._seen_requests))]
                phase_mod.request_started(rid)
        self.steps += 1
        phase_mod.set_phase(phase, prefill_tokens=prefill, decode_tokens=decode)

    def _request_done(self, scheduler: Any, request_id: str) -> None:
        if self._seen_requests.pop(request_id, False) is None:
            phase_mod.request_finished(request_id)
        pending = getattr(scheduler, "has_pending_requests", None)
        if pending is not None and not pending():
            phase_mod.set_phase(Phase.IDLE)

    def _observe_kv(self, cache: Any) -> None:
        sink = self.sink if self.sink is not None else phase_mod.active_sink()
        if observe_paged_attention_cache(cache, sink):
            self._hooked("paged_attention_cache")
        else:
            self._missing("paged_attention_cache (KV view off: see the log line)")

    def _hooked(self, part: str) -> None:
        """Name a hooked part once, however many calls hook it again (the list stays bounded)."""
        if part not in self.hooks:
            self.hooks.append(part)
        if part in self.missing:
            self.missing.remove(part)

    def _missing(self, part: str) -> None:
        if part not in self.missing:
            self.missing.append(part)


def attach_transformers(model: Any, sink: RecordSink | None = None, *,
                        kv_sample_interval_s: float = 0.5) -> TransformersHandle:
    """Tag phases for ``model.generate()`` and continuous batching; returns a handle to detach.

    ``sink`` receives the KV pool view of continuous batching
    (``vramscope.hooks.transformers_kv``) and the KV tokens ``generate()``'s calls hold (at
    most one sample per ``kv_sample_interval_s``, and one as each call ends); when
    ``install()`` has not run, phase events go to it too.
    """
    from vramscope.hooks.install import installed

    if sink is not None and not installed():
        phase_mod.configure(sink=sink)
    handle = TransformersHandle(model, sink, kv_sample_interval_s)
    if callable(getattr(model, "generate", None)):
        _set_instance_attr(model, "generate", handle._generate_wrapper(model.generate),
                           handle._undo)
        hook = model.register_forward_pre_hook(handle._forward_pre_hook, with_kwargs=True)
        handle._undo.append(hook.remove)
        handle.hooks.append("generate")
    else:
        handle._missing("model.generate")
    if callable(getattr(model, "init_continuous_batching", None)):
        _set_instance_attr(model, "init_continuous_batching",
                           handle._init_cb_wrapper(model.init_continuous_batching), handle._undo)
        handle.hooks.append("init_continuous_batching")
    else:
        handle._missing("model.init_continuous_batching (transformers too old?)")
    return handle


class PerCallPatches:
    """Method wrappers on objects that a server call creates, which never keep them alive.

    ``generate_batch`` builds a new manager, scheduler and KV cache on every call. A wrapper
    stored on such an object must not reference it strongly: a closure over the object or its
    bound method would make a cycle (object -> wrapper -> object) that only the cyclic GC
    frees, holding the whole KV pool until then; an undo list would hold it until ``detach()``
    (the retention defect of issue 13). So the wrapper calls the original through
    :func:`~vramscope.hooks.transformers_kv.weak_method`, and this registry keeps weak
    references only, pruned as objects die.
    """

    def __init__(self) -> None:
        self._patched: list[tuple[weakref.ref[Any], str]] = []

    def wrap(self, obj: Any, name: str, *, before: Callable[..., Any] | None = None,
             after: Callable[..., Any] | None = None) -> None:
        """Wrap ``obj.name``: ``before(obj, *args)`` runs first, its result goes to
        ``after(obj, result, before_result, *args)``; neither may raise into the caller."""
        original = weak_method(obj, name)
        ref = weakref.ref(obj)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            target = ref()
            ahead = _guarded(before, target, *args, **kwargs) if before else None
            result = original(*args, **kwargs)
            if after is not None:
                _guarded(after, target, result, ahead, *args, **kwargs)
            return result

        wrapper.__wrapped__ = getattr(type(obj), name)  # type: ignore[attr-defined]
        setattr(obj, name, wrapper)
        self._patched = [(r, n) for r, n in self._patched if r() is not None]
        self._patched.append((ref, name))

    def __len__(self) -> int:
        return sum(1 for ref, _ in self._patched if ref() is not None)

    def restore_all(self) -> None:
        """Remove the wrappers from the objects still alive (a call in flight at detach)."""
        for ref, name in self._patched:
            obj = ref()
            if obj is not None and name in vars(obj):
                delattr(obj, name)
        self._patched.clear()


def _guarded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        # text only: a kept record holding exc (or fn) would hold the call's objects
        log.warning("vramscope: transformers hook %s failed: %s", _name(fn), repr(exc))
        return None


def _set_instance_attr(obj: Any, name: str, value: object,
                       undo: list[Callable[[], None]]) -> None:
    had = name in vars(obj)
    before = vars(obj).get(name)
    setattr(obj, name, value)

    def restore() -> None:
        if had:
            setattr(obj, name, before)
        else:
            delattr(obj, name)

    undo.append(restore)


def _input_shape(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int]:
    ids = kwargs.get("input_ids")
    if ids is None and args:
        ids = args[0]
    if ids is None:
        ids = kwargs.get("inputs_embeds")
    shape = getattr(ids, "shape", None)
    if not shape:
        return 1, 1
    return int(shape[0]), int(shape[1]) if len(shape) > 1 else 1


def _device_index(model: Any) -> int:
    """The model's CUDA device index (the torch samples' ``device``), 0 on the CPU."""
    try:
        index = getattr(getattr(model, "device", None), "index", None)
    except Exception:
        return 0
    return index if isinstance(index, int) else 0


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)
