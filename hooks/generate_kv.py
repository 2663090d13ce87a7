"""The KV tokens ``generate()`` holds: ``kv_tokens_used`` for a per-request cache.

Each ``generate()`` call has its own cache, so allocated memory follows the tokens in flight,
which the leak detector takes off the floor; they are reported on ``Sample``s of source ``kv``
(no block figures: there is no pool). How they are counted and when a sample is put:
docs/hooks.md, "transformers". Nothing here raises into the model.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from vramscope.agent.records import Phase, Sample
from vramscope.hooks.sink import RecordSink


class GenerateTokens:
    """Tokens held per ``generate()`` call in flight, and the samples that report their sum."""

    def __init__(self, sink_fn: Any, device: int = 0, sample_interval_s: float = 0.5,
                 phase_fn: Any = None) -> None:
        if not sample_interval_s >= 0:
            raise ValueError(f"sample_interval_s must be >= 0, got {sample_interval_s!r}")
        self._sink_fn = sink_fn  # () -> RecordSink | None: the sink may be wired later
        self.device = device
        self.sample_interval_s = sample_interval_s
        self._phase_fn = phase_fn
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}  # call id -> tokens its cache holds
        self._lengths: dict[str, int] = {}  # call id -> sequence length counted so far
        self._next_s = float("-inf")

    def forward(self, call_id: str, rows: int, length: int, cache: Any) -> None:
        """A forward pass of call ``call_id``: ``rows`` × ``length`` new tokens over ``cache``
        (its ``past_key_values``, or None)."""
        with self._lock:
            cached = _cached_length(cache)
            if cached is None:
                cached = self._lengths.get(call_id, 0)
            self._lengths[call_id] = cached + length
            self._held[call_id] = rows * (cached + length)
            now_s = time.monotonic()
            if now_s < self._next_s:
                return
            self._next_s = now_s + self.sample_interval_s
            total = sum(self._held.values())
        self._put(total)

    def finished(self, call_id: str) -> None:
        """Call ``call_id`` returned (or raised): its cache is gone."""
        with self._lock:
            if self._held.pop(call_id, None) is None:
                return
            self._lengths.pop(call_id, None)
            total = sum(self._held.values())
            self._next_s = time.monotonic() + self.sample_interval_s
        self._put(total)

    def held(self) -> int:
        """The tokens the calls in flight hold now."""
        with self._lock:
            return sum(self._held.values())

    def _put(self, tokens: int) -> None:
        try:
            sink: RecordSink | None = self._sink_fn()
            if sink is None:
                return
            phase = self._phase_fn() if self._phase_fn is not None else Phase.UNKNOWN
            sink.put(Sample(time.time(), self.device, phase, "kv", self.pid,
                            kv_tokens_used=tokens))
        except Exception:
            pass  # a sink must not raise; if one does, the model still must not see it


def _cached_length(cache: Any) -> int | None:
    """The tokens ``cache`` holds per row before this pass (``Cache.get_seq_length()``), or
    None where it is no cache object transformers made."""
    if cache is None:
        return None
    get = getattr(cache, "get_seq_length", None)
    if get is None:
        return None
    try:
        length = get()
    except Exception:
        return None
    return int(length) if isinstance(length, int) and length >= 0 else None
