"""The data behind ``/api/v1/analysis``, the Capacity view, the configuration check and the
leak make-up: the bridge from the store to ``vramscope.agent.analysis`` and
``vramscope.agent.estimate``.

No verdict is made and no alert engine runs here: verdicts and alerts are the ones the agent
stored (the Leaks and OOM-risk views are :mod:`vramscope.dashboard.verdict_views`). The analysis
document's summaries are made from the records the store's reader gives for the window
(:func:`vramscope.agent.store.reader.records`: bounded, from the tier it chose, named in
``tier``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramscope.agent import estimate as est
from vramscope.agent.errors import UsageError
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Event
from vramscope.agent.store import Store, reader
from vramscope.agent.timefmt import representable
from vramscope.dashboard import queries
from vramscope.dashboard.errors import BadParameter

Settings = Mapping[str, Any] | None  # the dashboard's Config; None: the defaults
# The analysis document's summaries over a long window are peaks and counts, which a coarser
# tier gives as well (a bucket's maximum is its peak whatever its width): it reads fewer.
REPORT_BUCKETS = 100


def window_param(too_long: reader.WindowTooLong) -> BadParameter:
    """A window the reader's width ladder cannot cover, as the request's bad ``start``."""
    return BadParameter("start", str(too_long))


def report(store: Store, config: Settings, device: int, host: str | None, start: float,
           end: float) -> dict[str, Any]:
    """The ``vramscope.analysis/1`` document for one device and window: its summaries (phases,
    fragmentation, KV peaks, OOMs) from the records of the tier they were read from (``tier``,
    ``bucket_s``); every verdict (leak, OOM risk, the OOM's cause, per process) and the alerts
    as the alert engine stored them (``verdicts_from``: "store", ``alerts_from``), the answers
    every page shows, said to be missing where none is stored. No engine runs here."""
    from vramscope.agent.analysis.makeup import LAYOUT_EVENT, leak_makeup
    from vramscope.agent.analysis.report import summaries_document
    from vramscope.agent.store.window_verdicts import attach_window

    try:
        window = reader.records(store, reader.Span(device, start, end, host),
                                SAMPLE_COUNTER_FIELDS, peaks=True, max_buckets=REPORT_BUCKETS)
    except reader.WindowTooLong as exc:
        raise window_param(exc) from None
    postmortems = [pm for _, pm in store.postmortems(device, host)
                   if start <= pm.ts_s <= end]
    doc = summaries_document(window.samples, window.events, postmortems, device=device)
    doc.update(tier=window.tier, bucket_s=window.bucket_s)
    lead = attach_window(doc, store, device, host, start, end)
    d = doc["devices"][str(device)]
    if d["leak"]["detected"]:  # what the stored leak's growth is made of, where layouts are
        d["leak"]["makeup"] = leak_makeup([e for e in window.events if e.name == LAYOUT_EVENT],
                                          device, lead["start_ts_s"])
    check = config_check_view(store, device, host, end)
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


ORPHAN_EVENT_LIMIT = 1_000  # orphaned-block reports a window lists


def orphan_events(store: Store, device: int, host: str | None, start: float,
                  end: float) -> list[dict[str, Any]]:
    """The KV pool's orphaned-block reports in the window (shown; the engine judges them)."""
    return [_orphan_json(e) for e in store.events(device, start, end, host=host,
                                                  names=("kv_orphaned_blocks",),
                                                  limit=ORPHAN_EVENT_LIMIT)]


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


def config_check_view(store: Store, device: int, host: str | None,
                      at_s: float) -> dict[str, Any] | None:
    """The ``[server]`` check the agent's alert engine made at the device's limit, as stored
    with its newest answer at or before ``at_s`` (the ``config_oom`` alert's; never made again
    here with the dashboard's config, which may not be the agent's); None where the agent
    stored none (it has no ``[server]`` section)."""
    from vramscope.agent.store.verdicts import device_answer

    answer = device_answer(store, device, host, at_s)
    return answer.config_check if answer is not None else None
