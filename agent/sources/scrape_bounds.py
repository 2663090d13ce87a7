"""What one scrape may say: every number read from a ``/metrics`` page is checked before it
becomes a record (the caps and why: docs/agent.md, "Scrape bounds").

A number out of bounds refuses the whole scrape (:class:`ScrapeRefused`, counted by the source);
nothing of a refused page is recorded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

# Pool sizes go into integer columns; no GPU holds 2**31 blocks or tokens.
MAX_POOL_SIZE = 2**31 - 1
# Counters are summed as floats: above 2**53 their increases are no longer exact.
MAX_COUNTER = float(2**53)
# Besides request events a scrape makes one KV sample, one server_load, one kv_preempted, one
# prefix_cache and one tokens record.
OTHER_RECORDS = 5

Rows = dict[str, list[tuple[dict[str, str], float]]]


class ScrapeRefused(ValueError):
    """A page whose numbers are out of bounds; its message names the metric and the value."""


class ScrapeBounds(NamedTuple):
    """The caps of one source (from ``[sources.prometheus]``)."""

    max_requests: int = 1_000_000
    max_request_events: int = 128

    @property
    def max_records(self) -> int:
        """The most records one scrape can make."""
        return self.max_request_events + OTHER_RECORDS

    def check_requests(self, name: str | None, rows: Rows) -> None:
        """Running or waiting: each value and their sum finite, >= 0 and <= max_requests."""
        _check(name, rows, float(self.max_requests), "sources.prometheus.max_requests")

    def check_records(self, count: int) -> None:
        if count > self.max_records:
            raise ScrapeRefused(f"{count} records from one scrape, more than "
                                f"{self.max_records} (sources.prometheus.max_request_events "
                                f"+ {OTHER_RECORDS})")


def check_ratio(name: str | None, rows: Rows) -> None:
    """A usage ratio: each value in [0, 1] (their mean is used, not their sum)."""
    for _, value in rows.get(name or "", ()):
        _check_value(name or "", value, 1.0, "a ratio")


def check_pool_size(name: str | None, label: str | None, rows: Rows) -> None:
    """The pool size, read from a label or from the value, below ``MAX_POOL_SIZE`` in all."""
    if name is None:
        return
    values: list[float] = []
    for labels, value in rows.get(name, ()):
        raw = labels.get(label) if label else value
        try:
            values.append(float(raw))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue  # not a number: the pool size stays unknown (usage counted in parts)
    _check_sum(name, values, float(MAX_POOL_SIZE), "the largest pool size")


def check_counter(name: str | None, rows: Rows) -> None:
    _check(name, rows, MAX_COUNTER, "2**53, above which increases are not exact")


def _check(name: str | None, rows: Rows, cap: float, why: str) -> None:
    if name is None:
        return
    _check_sum(name, [value for _, value in rows.get(name, ())], cap, why)


def _check_sum(name: str, values: Iterable[float], cap: float, why: str) -> None:
    total = 0.0
    for value in values:
        _check_value(name, value, cap, why)
        total += value
    if total > cap:
        raise ScrapeRefused(f"{name} adds up to {total:g} over its label sets, above {cap:g} "
                            f"({why})")


def _check_value(name: str, value: float, cap: float, why: str) -> None:
    if not math.isfinite(value) or value < 0:
        raise ScrapeRefused(f"{name} = {value!r} is not a finite number >= 0")
    if value > cap:
        raise ScrapeRefused(f"{name} = {value:g} is above {cap:g} ({why})")
