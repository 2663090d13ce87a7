"""Pure functions that turn downsampled store rows and events into the timeline document.

No I/O here: :mod:`vramscope.dashboard.queries` fetches, these shape. The document is what
``GET /api/v1/timeline`` returns and what :func:`vramscope.dashboard.timeline_figure.build`
draws.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from vramscope.agent.alerts.device import PROCESS_GONE_S
from vramscope.agent.analysis.fragmentation import external_ratio, split_ratio
from vramscope.agent.records import Event
from vramscope.agent.store.reader import (
    KV_PROCESS_COLUMNS,
    PROCESS_COLUMNS,
    UNREAD_LIMIT,
    UNREAD_TIERS,
)
from vramscope.agent.store.verdicts import process_label
from vramscope.agent.timefmt import iso_utc

if TYPE_CHECKING:
    from vramscope.agent.store.reader import ProcessWindow

# What the timeline asks the store for, in the order the plots use them.
TIMELINE_COLUMNS: tuple[str, ...] = (
    "allocated_bytes", "reserved_bytes", "device_used_bytes", "device_total_bytes",
    "inactive_split_bytes", "largest_free_block_bytes", "num_alloc_retries", "num_ooms",
    "kv_blocks_used", "kv_blocks_cached", "kv_blocks_total", "kv_tokens_used",
)


def series_from_rows(rows: Sequence[dict[str, Any]],
                     columns: Sequence[str]) -> dict[str, dict[str, list[Any]]]:
    """Per column: bucket times with that bucket's min and max, skipping empty buckets; and
    its last value (``last``) and when it was read (``last_ts``: the bucket's newest sample)
    for the counters drawn as steps (``STEP_COLUMNS``), so a step that ends a bucket ends at
    the value the bucket ended with, from the moment it was read."""
    out: dict[str, dict[str, list[Any]]] = {}
    for col in columns:
        lo_key, hi_key = f"{col}_min", f"{col}_max"
        kept = [r for r in rows if r[hi_key] is not None]
        if kept:
            out[col] = {"ts": [r["ts_s"] for r in kept], "min": [r[lo_key] for r in kept],
                        "max": [r[hi_key] for r in kept]}
            if col in STEP_COLUMNS:
                out[col]["last"] = [r.get(f"{col}_last") for r in kept]
                out[col]["last_ts"] = [r.get("last_ts_s") for r in kept]
    return out


# Counters that hold their value between samples (a pool's blocks, a queue's length): drawn
# as steps, never as lines that slope from one sample to the next.
STEP_COLUMNS = frozenset({"kv_blocks_used", "kv_blocks_cached", "kv_blocks_total"})
GAP_FACTOR = 2.5  # samples further apart than this many usual spacings leave a gap


def gap_after_s(ts: Sequence[float], bucket_s: float, held_s: float = 0.0) -> float:
    """How far apart two drawn values of one series may be before the space between them is a
    gap (no samples) rather than a held value: ``GAP_FACTOR`` times the larger of the bucket,
    the series' usual (median) spacing, so a source sampled every 15 s is not all gaps, and
    ``held_s``, the longest its source promises to hold a value unsampled while it runs (the
    vLLM plugin samples its pool at each engine step that changed it, a few ms apart under
    load, and an unchanged busy pool every ``sampling.kv_interval_s``: held values, not
    silences; a silence, an idle server, is far longer)."""
    spacings = sorted(b - a for a, b in zip(ts, ts[1:]) if b > a)
    usual = spacings[len(spacings) // 2] if spacings else 0.0
    return GAP_FACTOR * max(bucket_s, usual, held_s)


def step_points(ts: Sequence[float], peaks: Sequence[Any], lasts: Sequence[Any] | None,
                bucket_s: float, gaps: bool = True,
                last_ts: Sequence[float | None] | None = None, held_s: float = 0.0
                ) -> tuple[list[float], list[Any]]:
    """``(xs, ys)`` of a counter drawn with Plotly's ``shape="hv"``: each bucket's peak from its
    start, held to the next bucket; where the next one is more than :func:`gap_after_s` away,
    the value is held to its bucket's end (ending at the bucket's last value) and a ``None``
    breaks the line: a gap without samples is drawn as a gap, never as a slope or a held
    value nobody measured (``held_s``: see :func:`gap_after_s`). ``gaps=False``: values that
    are changes (an event per change of a count) hold until the next change, however far; a
    bucket still ends at its last value.
    ``last_ts`` (when each bucket's last value was read) places a bucket's values in time
    where the buckets are finer than the source's readings (a zoomed-in window): a bucket
    that ended at its peak reaches it at that moment (the value before it holds until then,
    never drawn ahead of the source), and one that ended below its peak steps down to its
    last value at that moment, also where the next bucket follows at once. So the line holds
    what the source said last (the vLLM plugin's value at an engine step's end, which
    ``/metrics`` publishes), and each bucket's peak (a step's pool before its finished
    requests freed their blocks, which ``/metrics`` never shows) still stands in it."""
    xs: list[float] = []
    ys: list[Any] = []
    gap_s = gap_after_s(ts, bucket_s, held_s) if gaps else float("inf")
    for i, (t, peak) in enumerate(zip(ts, peaks)):
        following = ts[i + 1] if i + 1 < len(ts) else None
        last = lasts[i] if lasts is not None and lasts[i] is not None else peak
        read_s = last_ts[i] if last_ts is not None else None
        inside = read_s is not None and t < read_s < min(
            t + bucket_s, following if following is not None else t + bucket_s)
        # ``read_s is not None`` repeats what ``inside`` holds, for the type checker
        xs.append(read_s if read_s is not None and inside and last == peak else t)
        ys.append(peak)
        if read_s is not None and inside and last != peak:
            xs.append(read_s)  # down to the bucket's last value where it was read
            ys.append(last)
            peak = last
        if following is not None and following - t <= gap_s:
            if last != peak and following - t > bucket_s:  # the bucket ended lower
                xs.append(t + bucket_s)
                ys.append(last)
            continue
        end = t + bucket_s if following is None else min(t + bucket_s, following)
        xs.append(end)
        ys.append(last)
        if following is not None:
            xs.append(end)
            ys.append(None)
    return xs, ys


def load_series(events: Iterable[Event], start_s: float, end_s: float, bucket_s: float
                ) -> dict[str, dict[str, list[Any]]]:
    """Running and waiting requests (``server_load`` events, of the vLLM plugin and of the
    Prometheus source alike: each carries the counts from that moment on) as each bucket's
    peak, and preemptions (``kv_preempted``, ``count``) summed per bucket:
    ``{"running": {"ts", "max"}, "waiting": {...}, "preemptions": {"ts", "count"}}``, only
    the parts the window has data for. A bucket without a ``server_load`` event holds the
    counts of the one before it only while :func:`step_points` joins them."""
    width = bucket_s if bucket_s > 0 else max(end_s - start_s, 1.0)
    top = max(0, int((end_s - start_s) // width))
    peaks: dict[str, dict[int, int]] = {"running": {}, "waiting": {}}
    lasts: dict[str, dict[int, int]] = {"running": {}, "waiting": {}}
    preempted: dict[int, int] = {}
    for e in sorted(events, key=lambda e: e.ts_s):
        b = min(max(0, int((e.ts_s - start_s) // width)), top)
        data = e.data or {}
        if e.name == "kv_preempted":
            preempted[b] = preempted.get(b, 0) + _count(data.get("count", 1))
            continue
        for key, into in peaks.items():
            value = data.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                into[b] = max(value, into.get(b, 0))
                lasts[key][b] = value
    out: dict[str, dict[str, list[Any]]] = {}
    for key, into in peaks.items():
        if into:
            keys = sorted(into)
            out[key] = {"ts": [start_s + k * width for k in keys],
                        "max": [into[k] for k in keys], "last": [lasts[key][k] for k in keys]}
    if preempted:
        keys = sorted(preempted)
        out["preemptions"] = {"ts": [start_s + k * width for k in keys],
                              "count": [preempted[k] for k in keys]}
    return out


def prefix_series(events: Iterable[Event], start_s: float, end_s: float, bucket_s: float
                  ) -> dict[str, Any]:
    """Prefix-cache hit tokens per bucket, by vLLM's definition (``hit_tokens`` of the plugin's
    ``kv_alloc`` events, whose sum is ``vllm:prefix_cache_hits_total``, and of the Prometheus
    source's ``prefix_cache`` counter increases), the tokens looked up (``query_tokens``, the
    same two sources: ``vllm:prefix_cache_queries_total``), and apart from them the tokens a
    preempted request found again in its own blocks (``preempted_hit_tokens``, which vLLM does
    not count): ``{"ts", "hit_tokens", "query_tokens", "preempted_hit_tokens", "hit_rate"}``,
    buckets with any of them. ``hit_rate``: the window's hits over its queries, vLLM's hit
    rate (``prefix_cache_hits / prefix_cache_queries``), None where nothing was queried
    (a KV pool that does not count its lookups)."""
    width = bucket_s if bucket_s > 0 else max(end_s - start_s, 1.0)
    top = max(0, int((end_s - start_s) // width))
    sums: dict[int, list[int]] = {}
    for e in events:
        data = e.data or {}
        got3 = (_count(data.get("hit_tokens")), _count(data.get("query_tokens")),
                _count(data.get("preempted_hit_tokens")))
        if any(got3):
            got = sums.setdefault(min(max(0, int((e.ts_s - start_s) // width)), top), [0, 0, 0])
            for i, n in enumerate(got3):
                got[i] += n
    keys = sorted(sums)
    hits, queries = (sum(sums[k][i] for k in keys) for i in (0, 1))
    return {"ts": [start_s + k * width for k in keys],
            "hit_tokens": [sums[k][0] for k in keys],
            "query_tokens": [sums[k][1] for k in keys],
            "preempted_hit_tokens": [sums[k][2] for k in keys],
            "hit_rate": hits / queries if queries else None}


def token_series(events: Iterable[Event], start_s: float, end_s: float, bucket_s: float
                 ) -> dict[str, list[Any]]:
    """Prompt and generated tokens per second in each bucket (``tokens`` events: the counter
    increases of ``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total`` the Prometheus
    source scraped, and the vLLM plugin's tokens of the requests finished), buckets with any:
    ``{"ts", "prompt_per_s", "generation_per_s"}``. An event counts the stretch from its
    ``since_s`` to its time (up to ``TOKENS_EVERY_S``): its tokens are spread over the buckets
    of that stretch evenly (a 10 s count is not a spike in one 1 s bucket); the part before the
    window is not the window's."""
    width = bucket_s if bucket_s > 0 else max(end_s - start_s, 1.0)
    top = max(0, int((end_s - start_s) // width))
    sums: dict[int, list[float]] = {}
    for e in events:
        data = e.data or {}
        counts = (_count(data.get("prompt_tokens")), _count(data.get("generation_tokens")))
        if not any(counts):
            continue
        since = data.get("since_s")
        lo = since if isinstance(since, (int, float)) and not isinstance(since, bool) \
            and math.isfinite(since) and since < e.ts_s else e.ts_s
        for k, share in _spread(lo, e.ts_s, start_s, width, top):
            got = sums.setdefault(k, [0.0, 0.0])
            got[0] += counts[0] * share
            got[1] += counts[1] * share
    keys = sorted(sums)
    return {"ts": [start_s + k * width for k in keys],
            "prompt_per_s": [sums[k][0] / width for k in keys],
            "generation_per_s": [sums[k][1] / width for k in keys]}


def _spread(lo: float, hi: float, start_s: float, width: float, top: int
            ) -> list[tuple[int, float]]:
    """The buckets (within 0..top) that [lo, hi] overlaps, with the share of it in each; an
    instant (lo == hi) is all in its bucket."""
    first, last = int((lo - start_s) // width), int((hi - start_s) // width)
    if first == last:
        return [(min(max(0, last), top), 1.0)]
    out = []
    for k in range(max(0, first), min(top, last) + 1):
        a, b = max(lo, start_s + k * width), min(hi, start_s + (k + 1) * width)
        if b > a:
            out.append((k, (b - a) / (hi - lo)))
    return out


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def derived_series(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, list[Any]]]:
    """Fragmentation ratios per bucket, by the analysis' own definitions
    (:mod:`vramscope.agent.analysis.fragmentation`, the risk model's), never a copy here.

    ``inactive_split_ratio`` is the bucket's largest inactive split over its largest reserved
    (clamped to 1). ``external_fragmentation`` is 1 − largest free block / cached free,
    computed only from a bucket's last row when that row carries a snapshot, so it is exact
    rather than mixed across readings. ``kv_tokens_per_block``
    (token occupancy: tokens stored per used KV block, at most the block size) likewise comes
    from the last row, when it is a KV pool reading. Each is a column at a time, by ``map``
    over the bucket's values (a ``Sample`` per bucket and reading was a third of the time).
    """
    ts = [r["ts_s"] for r in rows]

    def column(key: str) -> list[Any]:
        return [r.get(key) for r in rows]

    split = map(split_ratio, column("inactive_split_bytes_max"), column("reserved_bytes_max"))
    ext = map(external_ratio, column("largest_free_block_bytes_last"),
              column("reserved_bytes_last"), column("allocated_bytes_last"))
    occupancy = map(_per_block, column("kv_tokens_used_last"), column("kv_blocks_used_last"))
    out = {}
    for name, values in (("inactive_split_ratio", split), ("external_fragmentation", ext),
                         ("kv_tokens_per_block", occupancy)):
        kept = [(t, v) for t, v in zip(ts, values) if v is not None]
        if kept:
            out[name] = {"ts": [t for t, _ in kept], "max": [v for _, v in kept]}
    return out


def _per_block(tokens: int | None, blocks: int | None) -> float | None:
    return None if tokens is None or not blocks else tokens / blocks


def retry_markers(series: dict[str, dict[str, list[Any]]], name: str = "num_alloc_retries"
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


def process_parts(window: ProcessWindow) -> dict[str, Any]:
    """The timeline document's per-process keys (``processes``, ``processes_from``,
    ``processes_truncated``, ``process_pids``, ``mixed_processes``, ``mixed_processes_note``;
    each defined in docs/api.md, "The timeline document"). A process is ``ended`` when it sent
    nothing for ``PROCESS_GONE_S`` (the alert engine's "gone") before the device's newest sample
    in the window."""
    procs = [_process_entry(s.pid, s.last_ts_s, s.rows, window) for s in window.series]
    mixed = len(window.pids) > 1
    return {"processes": procs, "processes_from": window.from_s,
            "processes_truncated": window.truncated, "process_pids": list(window.pids),
            "mixed_processes": mixed,
            "mixed_processes_note": mixed_note(window) if mixed else None}


def kv_pool_parts(window: ProcessWindow | None) -> dict[str, Any]:
    """The timeline document's per-pool keys (``kv_pools``, ``kv_pool_pids``, ``several_kv_pools``,
    ``kv_pools_note``; docs/api.md, "The timeline document"): a process's KV pool is the pool
    (vLLM and ``KVSource`` keep one a process), so pools of different sizes on one device are told
    apart by pid, and each pool's ``kv_used_ratio`` is the share of its own pool."""
    if window is None:
        return {"kv_pools": [], "kv_pool_pids": [], "several_kv_pools": False,
                "kv_pools_note": None}
    pools = []
    for s in window.series:
        entry = _process_entry(s.pid, s.last_ts_s, s.rows, window, KV_PROCESS_COLUMNS)
        kept = [r for r in s.rows
                if r.get("kv_blocks_used_max") is not None and r.get("kv_blocks_total_max")]
        entry["series"]["kv_used_ratio"] = {
            "ts": [r["ts_s"] for r in kept],
            "max": [r["kv_blocks_used_max"] / r["kv_blocks_total_max"] for r in kept],
            "used": [r["kv_blocks_used_max"] for r in kept],
            "total": [r["kv_blocks_total_max"] for r in kept]}
        entry["blocks_total"] = max((r["kv_blocks_total_max"] for r in kept), default=None)
        pools.append(entry)
    several = len(window.pids) > 1
    return {"kv_pools": pools, "kv_pool_pids": list(window.pids), "several_kv_pools": several,
            "kv_pools_note": _kv_pools_note(window) if several else None}


def _kv_pools_note(window: ProcessWindow) -> str | None:
    """Why a part of a window with several KV pools draws none of them (the tiers keep no
    pid, and a range over pools of different sizes is no pool's)."""
    n = len(window.pids)
    if window.unread == UNREAD_LIMIT:
        return (f"{n} KV pools: each is drawn from at most {window.raw_limit:,} raw samples, "
                f"and this window holds more. Zoom in to see each pool.")
    if window.unread != UNREAD_TIERS:
        return None
    if window.from_s is not None:
        return (f"{n} KV pools, each drawn from {iso_utc(window.from_s, ms=False)} on; before "
                f"it only the tiers answer, which keep no process (raw samples are kept "
                f"retention.raw_s).")
    return (f"{n} KV pools: not drawn, as only the tiers answer this window and they keep no "
            f"process (raw samples are kept retention.raw_s).")


def _process_entry(pid: int | None, last_ts_s: float, rows: list[dict[str, Any]],
                   window: ProcessWindow, known: Sequence[str] = PROCESS_COLUMNS
                   ) -> dict[str, Any]:
    row = window.names.get(pid) if pid is not None else None
    label = process_label(row)
    newest = window.newest_ts_s
    columns = [c for c in known if rows and f"{c}_max" in rows[0]]
    return {"pid": pid, "name": (row or {}).get("name"), "model": (row or {}).get("model"),
            "rank": (row or {}).get("rank"), "label": label,
            "process": f"{label} (pid {pid})" if pid is not None else "samples without a pid",
            "ended": newest is not None and newest - last_ts_s >= PROCESS_GONE_S,
            "last_ts": last_ts_s, "series": series_from_rows(rows, columns)}


def mixed_note(window: ProcessWindow) -> str | None:
    """Why allocated and reserved are a range over several processes in (a part of) the
    window, and what shows each process apart; None where every part has per-process series."""
    n = len(window.pids)
    if window.unread == UNREAD_TIERS:
        keep = ("the per-second tier and the rollups, which retention keeps after the raw "
                "samples, have no process")
        if window.from_s is not None:
            return (f"Per-process lines from {iso_utc(window.from_s, ms=False)} on (this "
                    f"device's first raw sample); before it allocated and reserved are each "
                    f"bucket's range over {n} processes: {keep}. Raw samples are kept "
                    f"retention.raw_s.")
        later = ("" if window.raw_from_s is None
                 else f"; this device's begin at {iso_utc(window.raw_from_s, ms=False)}")
        return (f"Allocated and reserved are each bucket's range over {n} processes: {keep}. "
                f"Per-process lines need raw samples, kept retention.raw_s{later}.")
    if window.unread == UNREAD_LIMIT:
        return (f"Allocated and reserved are each bucket's range over {n} processes: "
                f"per-process lines group at most {window.raw_limit:,} raw samples, and this "
                f"window holds more. Zoom in to see each process.")
    return None
