"""A log that writes at most a burst of lines a window: a client cannot flood the agent's log.

The ingest server says why it refused a connection or records at a rate a hostile client sets;
each such line goes through a :class:`RateLimitedLog`, which counts what it leaves out and says
how many in the next line it writes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

LOG_BURST = 10  # lines per LOG_WINDOW_S about refused connections; the rest are counted
LOG_WINDOW_S = 60.0


class RateLimitedLog:
    """At most ``burst`` lines per ``window_s``; the lines beyond are counted and the next line
    written says how many were left out (a client cannot flood the log)."""

    def __init__(self, logger: logging.Logger, level: int, burst: int = LOG_BURST,
                 window_s: float = LOG_WINDOW_S) -> None:
        self._log, self._level, self._burst, self._window_s = logger, level, burst, window_s
        self._window_start = -float("inf")
        self._in_window = 0
        self._left_out = 0
        self.left_out_total = 0

    def __call__(self, msg: str, *args: Any, **kwargs: Any) -> None:
        now = time.monotonic()
        if now - self._window_start >= self._window_s:
            self._window_start, self._in_window = now, 0
        if self._in_window >= self._burst:
            self._left_out += 1
            self.left_out_total += 1
            return
        self._in_window += 1
        if self._left_out:
            msg += f" ({self._left_out} similar lines left out)"
            self._left_out = 0
        self._log.log(self._level, msg, *args, **kwargs)
