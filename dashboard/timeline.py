"""Pure functions that turn downsampled store rows and events into the timeline document.

No I/O here: :mod:`vramscope.dashboard.queries` fetches, these shape. The document is what
``GET /api/v1/timeline`` returns and what :func:`vramscope.dashboard.figures.timeline_figure` draws.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from vramscope.agent.records import Event, Phase, Sample

# What the timeline asks the store for, in the order the plots use them.
TIMELINE_COLUMNS: tuple[str, ...] = (
    "allocated_bytes", "reserved_bytes", "device_used_bytes", "device_total_bytes",
    "inactive_split_bytes", "largest_free_block_bytes", "num_alloc_retries", "num_ooms",
    "kv_blocks_used", "kv_blocks_cached", "kv_blocks_total", "kv_tokens_used",
)
REQUEST_EVENTS: tuple[str, ...] = ("request_start", "request_end")
RARE_EVENTS: tuple[str, ...] = ("oom", "kv_orphaned_blocks")  # always shown
BAND_PHASES = frozenset({Phase.PREFILL.value, Phase.DECODE.value, Phase.IDLE.value})


def series_from_rows(rows: Sequence[dict[str, Any]],
                     columns: Sequence[str]) -> dict[str, dict[str, list]]:
    """Per column: bucket times with that bucket's min and max, skipping empty buckets."""
    out: dict[str, dict[str, list]] = {}
    for col in columns:
        lo_key, hi_key = f"{col}_min", f"{col}_max"
        kept = [r for r in rows if r[hi_key] is not None]
        if kept:
            out[col] = {"ts": [r["ts_s"] for r in kept], "min": [r[lo_key] for r in kept],
                        "max": [r[hi_key] for r in kept]}
    return out


def derived_series(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, list]]:
    """Fragmentation ratios per bucket.

    ``inactive_split_ratio`` is the bucket's largest inactive split over its largest reserved
    (never above 1, since split bytes live inside reserved). ``external_fragmentation`` is
    1 − largest free block / cached free, computed only from a bucket's last row when that row
    carries a snapshot, so it is exact rather than mixed across readings. ``kv_tokens_per_block``
    (token occupancy: tokens stored per used KV block, at most the block size) likewise comes
    from the last row, when it is a KV pool reading.
    """
    split: dict[str, list] = {"ts": [], "max": []}
    ext: dict[str, list] = {"ts": [], "max": []}
    occupancy: dict[str, list] = {"ts": [], "max": []}
    for r in rows:
        tokens, blocks = r.get("kv_tokens_used_last"), r.get("kv_blocks_used_last")
        if tokens is not None and blocks:
            occupancy["ts"].append(r["ts_s"])
            occupancy["max"].append(tokens / blocks)
        reserved = r.get("reserved_bytes_max")
        inactive = r.get("inactive_split_bytes_max")
        if reserved and inactive is not None:
            split["ts"].append(r["ts_s"])
            split["max"].append(min(1.0, inactive / reserved))
        value = _external_fragmentation(r.get("largest_free_block_bytes_last"),
                                        r.get("reserved_bytes_last"), r.get("allocated_bytes_last"))
        if value is not None:
            ext["ts"].append(r["ts_s"])
            ext["max"].append(value)
    return {name: s for name, s in (("inactive_split_ratio", split),
                                    ("external_fragmentation", ext),
                                    ("kv_tokens_per_block", occupancy)) if s["ts"]}


def _external_fragmentation(largest: int | None, reserved: int | None,
                            allocated: int | None) -> float | None:
    if largest is None or reserved is None or allocated is None or reserved <= allocated:
        return None
    return max(0.0, min(1.0, 1.0 - largest / (reserved - allocated)))


def retry_markers(series: dict[str, dict[str, list]], name: str = "num_alloc_retries"
                  ) -> list[dict[str, Any]]:
    """Buckets where a cumulative counter rose: ``{"ts", "count"}`` with the increase."""
    s = series.get(name)
    if not s:
        return []
    out, previous = [], s["min"][0]
    for ts, hi in zip(s["ts"], s["max"]):
        if hi > previous:
            out.append({"ts": ts, "count": hi - previous})
        previous = max(previous, hi)
    return out


def bands_from_events(events: Iterable[Event], end_s: float) -> list[dict[str, Any]]:
    """Phase-change events to bands: each phase lasts until the next change."""
    changes = [(e.ts_s, e.phase.value) for e in events if e.phase is not None]
    return _bands(changes, end_s)


def bands_from_samples(samples: Iterable[Sample], end_s: float) -> list[dict[str, Any]]:
    """Sample phases to bands (``unknown`` samples, e.g. from NVML, say nothing)."""
    changes = [(s.ts_s, s.phase.value) for s in samples if s.phase is not Phase.UNKNOWN]
    return _bands(changes, end_s)


def _bands(changes: list[tuple[float, str]], end_s: float) -> list[dict[str, Any]]:
    bands: list[dict[str, Any]] = []
    for i, (ts, phase) in enumerate(changes):
        stop = changes[i + 1][0] if i + 1 < len(changes) else end_s
        if phase not in BAND_PHASES or stop <= ts:
            continue
        if bands and bands[-1]["phase"] == phase and bands[-1]["end"] >= ts:
            bands[-1]["end"] = stop
        else:
            bands.append({"phase": phase, "start": ts, "end": stop})
    return bands


def coarsen_bands(bands: list[dict[str, Any]], start_s: float, end_s: float,
                  buckets: int) -> list[dict[str, Any]]:
    """At most ``buckets`` bands: each bucket takes the phase that held it longest."""
    if len(bands) <= buckets:
        return bands
    width = (end_s - start_s) / buckets
    held: list[dict[str, float]] = [{} for _ in range(buckets)]
    for band in bands:
        _spread(band, start_s, width, held)
    per_bucket = [(start_s + i * width, max(h, key=h.get) if h else "none")
                  for i, h in enumerate(held)]
    return _bands(per_bucket, end_s)  # "none" buckets are skipped: not a band phase


def _spread(band: dict[str, Any], start_s: float, width: float,
            held: list[dict[str, float]]) -> None:
    first = max(0, int((band["start"] - start_s) // width))
    last = min(len(held) - 1, int((band["end"] - start_s) // width))
    for i in range(first, last + 1):
        lo = max(band["start"], start_s + i * width)
        hi = min(band["end"], start_s + (i + 1) * width)
        if hi > lo:
            held[i][band["phase"]] = held[i].get(band["phase"], 0.0) + hi - lo


def event_markers(events: Iterable[Event]) -> list[dict[str, Any]]:
    """Events as plain markers; every string stays a string (rendered as text)."""
    out = []
    for e in events:
        data = e.data or {}
        out.append({"ts": e.ts_s, "name": e.name, "request_id": e.request_id,
                    "message": _short(data.get("message")), "pid": e.pid})
    return out


def _short(value: Any, limit: int = 500) -> str | None:
    if value is None:
        return None
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
