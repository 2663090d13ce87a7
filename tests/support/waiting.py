"""Waiting on real processes and threads in tests (where a FakeClock cannot stand in)."""

from __future__ import annotations

import time


def wait_for(predicate, timeout_s: float = 10.0, poll_s: float = 0.01):
    """Poll ``predicate`` until it returns something truthy; return that, or fail the test."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"condition not met in {timeout_s} s")
