"""The data behind ``/api/v1/analysis``, the Capacity view, the configuration check and the
leak make-up: the bridge from the store to ``vramscope.agent.analysis`` and
``vramscope.agent.estimate``.

The verdicts (leak, OOM risk, per process, alerts) are not made here, and no alert engine
runs here: they are the alert engine's stored verdicts and the alerts the agent stored
(:mod:`vramscope.agent.store.verdicts`; the Leaks and OOM-risk views are in
:mod:`vramscope.dashboard.verdict_views`). This module reads a window's records (bounded: raw
samples, the per-second tier, or per-minute buckets) for the analysis document's summaries
(phases, fragmentation, KV peaks, OOMs: ``analysis.report.summaries_document``), and says
which tier in ``tier``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vramscope.agent import estimate as est
from vramscope.agent.errors import UsageError
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Event, Phase, Sample
from vramscope.agent.store import Store
from vramscope.agent.store.seconds import Second
from vramscope.agent.timefmt import representable
from vramscope.dashboard import queries
from vramscope.dashboard.errors import BadParameter

Settings = Mapping[str, Any] | None  # the dashboard's Config; None: the defaults
# Raw samples one request may analyse: building a Sample and running the models over it is
# Python work per sample, so the count is held to what fits well within the 300 ms a page may
# take (`vramscope bench dashboard`), and a longer window goes a tier up. Counted
# before anything is built (store.reader.count_at_most: an index range of at most N + 1 keys).
RAW_SAMPLE_LIMIT = 4_000
# The span of the per-second tier one request may analyse second by second. Not the samples
# but the floor windows set the leak detector's cost (a fit each): 4,000 raw samples at 10 Hz
# are 7 minutes, 4,000 seconds over an hour (60 fits). A longer
# old window goes a tier up, as a longer raw one does.
PER_SECOND_MAX_S = 1_200.0
# A longer window is read a tier up: per-minute buckets (the rollups the agent keeps, or raw
# rows grouped in SQL where none are kept yet), coarser when a window would need more than
# TIER_BUCKETS of them (7 days: 5-minute buckets).
# From two minutes on, each a multiple of the two-minute rollup group, so that a bucket holds
# whole indexed groups (downsample.width_grid: 7 days of 5-minute buckets were a sort of the
# week's minutes on SQLite; of ten-minute ones, a walk along the index).
TIER_WIDTHS_S = (60.0, 120.0, 240.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14_400.0, 43_200.0,
                 86_400.0)
TIER_BUCKETS = 2_100
# The analysis document's summaries over a long window are peaks and counts, which a coarser
# tier gives as well (a bucket's maximum is its peak whatever its width): it reads fewer.
REPORT_BUCKETS = 100
TIER_EVENTS = ("oom", "kv_orphaned_blocks")  # the events a tier keeps (requests are averaged out)
TIER_EVENT_LIMIT = 1_000


SECOND_S = 1.0  # the per-second tier's bucket
RAW = "raw samples"
PER_SECOND = "per-second tier"


@dataclass(frozen=True)
class Window:
    """The records a view analyses, and the tier they were read from."""

    samples: list[Sample]
    events: list[Event]
    tier: str  # "raw samples", "per-second tier[, then raw samples]", or how buckets were made
    bucket_s: float | None = None  # None: raw samples; SECOND_S: (partly) the per-second tier


def tier_width(span_s: float, max_buckets: int = TIER_BUCKETS) -> float:
    """The narrowest tier bucket that keeps ``span_s`` within ``max_buckets`` buckets."""
    for width in TIER_WIDTHS_S:
        if span_s / width <= max_buckets:
            return width
    raise BadParameter("start", f"a window of {span_s:.0f} s is longer than the dashboard "
                                f"analyses ({TIER_WIDTHS_S[-1] * max_buckets:.0f} s)")


def read_window(store: Store, device: int, host: str | None, start: float, end: float,
                columns: tuple[str, ...], peaks: bool, max_buckets: int = TIER_BUCKETS
                ) -> Window:
    """Raw samples and events (stitched after the per-second tier where retention deleted
    them: :func:`per_sample_window`) when the window holds at most ``RAW_SAMPLE_LIMIT``; else
    one sample per tier bucket carrying the bucket's minima at its start (phase idle: the
    minimum of allocated over a minute is the floor the leak detector takes) and, with
    ``peaks``, one in its middle carrying its maxima (the peaks the risk model trends)."""
    window = per_sample_window(store, device, host, start, end, peaks)
    if window is not None:
        return window
    width = tier_width(end - start, max_buckets)
    rows = store.timeline(device, start, end, 1, columns, host=host, lasts=False,  # no lasts
                          width_s=width)
    events = store.events(device, start, end, host=host, names=TIER_EVENTS,
                          limit=TIER_EVENT_LIMIT)
    return Window(bucket_samples(rows, device, width, columns, peaks), events,
                  _tier_name(store, device, host, start, end, width), width)


def _tier_name(store: Store, device: int, host: str | None, start: float, end: float,
               width: float, shown: float | None = None) -> str:
    """Where buckets ``width`` wide were read from (``Store.timeline`` reads rollups for
    buckets of half a minute or more, where kept, and the per-second tier for finer ones where
    raw samples are gone), and the buckets' width as analysed (``shown``, when they were
    merged further)."""
    from vramscope.agent.store.reader import read_from

    return f"{read_from(store, device, start, end, width, host)}, {shown or width:.3g} s buckets"


def bucket_samples(rows: list[dict[str, Any]], device: int, width: float,
                   columns: tuple[str, ...], peaks: bool) -> list[Sample]:
    """Downsampled rows (``Store.timeline``) as samples: see :func:`read_window`."""
    out = []
    for r in rows:
        low = {c: r[f"{c}_min"] for c in columns}
        if low.get("allocated_bytes") is None and low.get("device_used_bytes") is None:
            continue
        out.append(Sample(r["ts_s"], device, Phase.IDLE, "tier", None, **low))
        if peaks:
            high = {c: r[f"{c}_max"] for c in columns}
            out.append(Sample(r["ts_s"] + width / 2, device, Phase.DECODE, "tier", None, **high))
    return out


def per_sample_window(store: Store, device: int, host: str | None, start: float, end: float,
                      peaks: bool) -> Window | None:
    """The window's records one by one: raw samples, and before the device's first raw sample
    (retention deleted the older ones) the per-second tier's seconds (:func:`second_samples`);
    None when that would build more than ``RAW_SAMPLE_LIMIT`` samples (counted, not built:
    callers take a tier up). Events are all the window's: the frequent ones are gone with the
    raw samples, the rare ones (OOMs, orphaned blocks) kept with the rollups."""
    from vramscope.agent.store.reader import count_at_most, first_sample_ts, seconds_at_most

    horizon = first_sample_ts(store, device, host)
    old_end = end if horizon is None else min(horizon, end)
    n_seconds = (seconds_at_most(store, device, start, old_end, RAW_SAMPLE_LIMIT, host)
                 if old_end > start else 0)
    n_raw = count_at_most(store, device, start, end, RAW_SAMPLE_LIMIT, host)
    if (n_seconds and old_end - start > PER_SECOND_MAX_S
            or n_seconds * (2 if peaks else 1) + n_raw > RAW_SAMPLE_LIMIT):
        return None
    events = store.events(device, start, end, host=host)
    if not n_seconds:
        return Window(store.samples(device, start, end, host=host), events, RAW)
    samples = second_samples(store.seconds(device, start, old_end, host=host), device, peaks)
    if not n_raw:
        return Window(samples, events, PER_SECOND, SECOND_S)
    samples += store.samples(device, old_end, end, host=host)
    return Window(samples, events, f"{PER_SECOND}, then {RAW}", SECOND_S)


def second_samples(seconds: list[tuple[str, Second]], device: int,
                   peaks: bool) -> list[Sample]:
    """Seconds of the tier (``Store.seconds``) as samples, in the spirit of
    :func:`bucket_samples`: each second's minima at its start and, with ``peaks``, its maxima
    half a second on, both with the second's phase (that of its last sample) and source."""
    out = []
    for source, second in seconds:
        out.append(second.sample(device, "min", source or None))
        if peaks:
            out.append(second.sample(device, "max", source or None)
                       ._replace(ts_s=second.ts_s + SECOND_S / 2))
    out.sort(key=lambda s: s.ts_s)  # several sources' seconds interleave (a stable sort)
    return out


def report(store: Store, config: Settings, device: int, host: str | None, start: float,
           end: float) -> dict[str, Any]:
    """The ``vramscope.analysis/1`` document for one device and window: its summaries (phases,
    fragmentation, KV peaks, OOMs) from the records of the tier they were read from (``tier``,
    ``bucket_s``); every verdict (leak, OOM risk, the OOM's cause, per process) and the alerts
    as the alert engine stored them (``verdicts_from``: "store", ``alerts_from``), the answers
    every page shows, said to be missing where none is stored. No engine runs here."""
    from vramscope.agent.analysis.makeup import LAYOUT_EVENT, leak_makeup
    from vramscope.agent.analysis.report import summaries_document
    from vramscope.agent.store.verdicts import attach_window

    window = read_window(store, device, host, start, end, SAMPLE_COUNTER_FIELDS, peaks=True,
                         max_buckets=REPORT_BUCKETS)
    postmortems = [pm for _, pm in store.postmortems(device, host)
                   if start <= pm.ts_s <= end]
    doc = summaries_document(window.samples, window.events, postmortems, device=device)
    doc.update(tier=window.tier, bucket_s=window.bucket_s)
    lead = attach_window(doc, store, device, host, start, end)
    d = doc["devices"][str(device)]
    if d["leak"]["detected"]:  # what the stored leak's growth is made of, where layouts are
        d["leak"]["makeup"] = leak_makeup([e for e in window.events if e.name == LAYOUT_EVENT],
                                          device, lead["start_ts_s"])
    check = config_check_view(store, config, device, host)
    if check is not None:
        d["config_check"] = check
    return doc


LAYOUT_READ_LIMIT = 16  # memory_layout events read per query (each up to tens of kB)
# How far from the window's end (or the rise, or its start) a layout is looked for: the events
# index is (device, time), so a name is found by reading every event of the range; a server
# that records layouts records one a snapshot interval, one that does not would cost a scan of
# the whole window (a week: 1.3 M request events per device).
LAYOUT_LOOKBACK_S = 6 * 3600.0


def leak_makeup_view(store: Store, config: Settings, device: int, host: str | None,
                     start: float, end: float, rise_ts_s: float | None) -> dict[str, Any] | None:
    """The make-up of the growth in the window: the layout at the last idle point at or before
    the rise began (the window's first without one) diffed with the latest. Reads at most a few
    ``memory_layout`` events, whatever the window holds."""
    try:
        from vramscope.agent.analysis.makeup import LAYOUT_EVENT, leak_makeup
    except ImportError:
        return None
    interval = float(config["sampling.snapshot_interval_s"]) if config else 60.0
    latest = _last_event(store, device, host, start, end, LAYOUT_EVENT, interval)
    before = None
    if rise_ts_s is not None and start <= rise_ts_s < end:
        before = _last_event(store, device, host, start, rise_ts_s, LAYOUT_EVENT, interval)
    if before is None:
        first = store.events(device, start, min(end, start + LAYOUT_LOOKBACK_S), host=host,
                             names=(LAYOUT_EVENT,), limit=1)
        before = first[0] if first else None
    if before is None or latest is None or before.ts_s >= latest.ts_s:
        return None
    return leak_makeup([before, latest], device)


def _last_event(store: Store, device: int, host: str | None, lo: float, hi: float, name: str,
                step_s: float) -> Event | None:
    """The newest ``name`` event in [lo, hi] within ``LAYOUT_LOOKBACK_S`` of ``hi``: windows
    back from ``hi``, quadrupling, so that an event a minute costs a query or two."""
    width = 2 * max(step_s, 1.0)
    lo = max(lo, hi - LAYOUT_LOOKBACK_S)
    while True:
        got = store.events(device, max(lo, hi - width), hi, host=host, names=(name,),
                           limit=LAYOUT_READ_LIMIT)
        if got or hi - width <= lo:
            break
        width *= 4
    while len(got) == LAYOUT_READ_LIMIT:  # more than one read holds: page on to the newest
        more = store.events(device, got[-1].ts_s, hi, host=host, names=(name,),
                            limit=LAYOUT_READ_LIMIT)
        if more[-1].ts_s == got[-1].ts_s:
            break
        got = more
    return got[-1] if got else None


def orphan_events(store: Store, device: int, host: str | None, start: float,
                  end: float) -> list[dict[str, Any]]:
    """The KV pool's orphaned-block reports in the window (shown; the engine judges them)."""
    return [_orphan_json(e) for e in store.events(device, start, end, host=host,
                                                  names=("kv_orphaned_blocks",),
                                                  limit=TIER_EVENT_LIMIT)]


def _orphan_json(e: Event) -> dict[str, Any]:
    data = e.data or {}
    blocks = data.get("blocks", data.get("count"))
    return {"ts": e.ts_s, "pid": e.pid, "request_id": e.request_id,
            "blocks": blocks if isinstance(blocks, int) else None,
            "message": None if data.get("message") is None else str(data["message"])}


# --- capacity --------------------------------------------------------------------------------
def capacity(store: Store, host: str | None, shape: dict[str, Any]) -> dict[str, Any]:
    """Measured peaks of every device beside the estimator's total for ``shape``."""
    devices = []
    for d in store.devices(host=host or "*"):
        h = queries.host_or_none(store, d["host"])
        devices.append({"host": d["host"], "device": d["device_index"],
                        "peaks": _measured_peaks(store, d["device_index"], h)})
    gpu_bytes = shape.pop("gpu_memory_bytes", None) or _largest_limit(devices)
    estimate, problem = _estimate(shape, gpu_bytes)
    return {"devices": devices, "shape": shape, "estimate": estimate,
            "estimate_problem": problem}


def _measured_peaks(store: Store, device: int, host: str | None) -> dict[str, Any] | None:
    """None also for a device whose stored times no page can represent (a row at -1e300 or
    1e308 from before ingest bounded times: retention deletes it)."""
    span = store.time_range(device, host)
    if span is None or not (representable(span[0]) and representable(span[1])):
        return None
    return queries.measured_peaks(store, device, host)


def _largest_limit(devices: list[dict[str, Any]]) -> int | None:
    return max(((d["peaks"] or {}).get("device_total_bytes") or 0 for d in devices),
               default=0) or None


def _parameters(shape: dict[str, Any]) -> int:
    """``params_b`` when given; else counted from the shape (the estimator's own count, as
    ``vramscope estimate`` does for a config.json), noted in ``shape["params_source"]``."""
    if shape.get("params_b"):
        shape["params_source"] = "given"
        return int(shape["params_b"] * 1e9)
    heads = max(1, shape["hidden"] // shape["head_dim"])
    count = est.count_parameters(layers=shape["layers"], hidden=shape["hidden"], heads=heads,
                                 kv_heads=shape["kv_heads"], head_dim=shape["head_dim"],
                                 intermediate=shape["intermediate"], vocab=shape["vocab"],
                                 gated=shape.get("gated", True))
    shape["params_b"] = round(count / 1e9, 3)
    shape["params_source"] = ("counted from the shape, "
                              + ("gated MLP" if shape.get("gated", True) else "plain MLP"))
    return count


def _estimate(shape: dict[str, Any], gpu_bytes: int | None
              ) -> tuple[dict[str, Any], None] | tuple[None, str]:
    try:
        model = est.ModelShape(
            num_layers=shape["layers"], num_kv_heads=shape["kv_heads"],
            head_dim=shape["head_dim"], hidden_size=shape["hidden"],
            num_params=_parameters(shape), dtype=shape["dtype"],
            intermediate_size=shape["intermediate"], vocab_size=shape["vocab"],
            name=shape["name"])
        plan = est.Plan(context_tokens=shape["context"], concurrency=shape["concurrency"],
                        gpu_memory_bytes=gpu_bytes or est.gpu_memory_bytes("H200"),
                        margin_ratio=shape["margin"])
        return est.estimate(model, plan).to_json(), None
    except (UsageError, ValueError) as exc:
        return None, str(exc)


def config_check_view(store: Store, config: Settings, device: int,
                      host: str | None) -> dict[str, Any] | None:
    """The ``[server]`` check at the device's limit now (its process's cap, else NVML's total),
    as the ``config_oom`` alert makes it; None without a ``[server]`` section. A section the
    dashboard cannot read (a config.json gone since the agent started) is said, not a 500."""
    from vramscope.agent.alerts.config_check import check_json, limit_of, server_from_config
    from vramscope.agent.errors import ConfigError

    try:
        limits = server_from_config(config)
    except ConfigError as exc:
        return {"model": None, "fits": None, "needed_bytes": None, "limit_bytes": None,
                "headroom_bytes": None, "worst_request": None, "lower": None,
                "lower_to": None, "message": f"cannot check the configuration: {exc}"}
    if limits is None:
        return None
    now = queries.latest_values(store, device, host)
    limit = None if now is None else limit_of(
        now["device_total_bytes"], [p["limit_bytes"] for p in now["processes"]])
    return check_json(limits, limit)
