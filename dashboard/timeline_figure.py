"""The device timeline figure: memory, phases, fragmentation, KV pool and event lanes on one
time axis, laid out so the problem shows (pure: document in, Plotly figure out).

What each lane shows and why (memory auto-ranged with "0 to the limit" one click away, the
stored floor the leak detector judged on, a trace per process, phases and requests at every
span, counters as steps and gaps as gaps): docs/dashboard.md, "Pages". Lanes a device has no
data for take no space. The trace builders shared with the other figures
(``figures._memory_traces`` and friends, with their label escaping) are reused, and the
serving lanes' traces are ``timeline_serving.py``'s; this module decides the layout.
"""

from __future__ import annotations

from typing import Any

from vramscope.agent.store.reader import PROCESS_COLUMNS
from vramscope.dashboard import figures as f
from vramscope.dashboard import timeline_serving as serving

GIB = f.GIB
FLOOR_NAME = "idle floor (the leak detector's)"
LIMIT_NEAR = 1.25  # the limit is drawn in range when it is within this factor of the data
MARKER_ORDER = ("request start", "request end", "alloc retries", "alert fired",
                "orphaned KV blocks", "process exit", "OOM")  # bottom up, on every device
# (a marker label not listed, agent/event_kinds.py's, goes on top)
PHASE_SHARE_COLORS = {"prefill": "rgba(255,159,28,0.75)", "decode": "rgba(46,160,67,0.55)",
                      "setup": "rgba(130,80,223,0.5)", "idle": "rgba(140,149,159,0.35)"}
FRAGMENTATION_NOTE = ("the share of cached free memory outside the largest free block.<br>"
                      "A risk only when the largest request fits neither that block nor new "
                      "memory under the limit: the OOM-risk page and alerts say when.")
# panel heights (relative) in drawing order, top down
PANEL_WEIGHTS = {"memory": 5.0, "phases": 0.7, "fragmentation": 1.8, "kv": 2.0, "load": 1.4,
                 "prefix": 1.0, "tokens": 1.0, "requests": 1.2, "markers": 1.6}
PANEL_AXIS = {"memory": "yaxis", "phases": "yaxis6", "fragmentation": "yaxis2", "kv": "yaxis3",
              "load": "yaxis8", "prefix": "yaxis9", "tokens": "yaxis10", "requests": "yaxis7",
              "markers": "yaxis4"}
REQUEST_COLOR = "#2da44e"  # as the request start markers
GAP = 0.035
# times of day under a day per tick (the date is in the axis title: Plotly's own second line
# of dates overlapped a tick), dates beyond
TICK_FORMATS = [{"dtickrange": [None, 43_200_000], "value": "%H:%M"},  # ticks up to 12 h apart
                {"dtickrange": [43_200_001, None], "value": "%b %d"}]
GAP_ABOVE = {"fragmentation": 0.075}  # room for the two-line note on what the ratio means
MIXED_STYLE = {
    "allocated_bytes": ("allocated, all processes (range over processes per bucket)",
                        f.COLORS["allocated"], "rgba(31,111,235,0.18)"),
    "reserved_bytes": ("reserved, all processes (range over processes per bucket)",
                       f.COLORS["reserved"], "rgba(130,80,223,0.14)")}


def build(doc: dict[str, Any], fragmentation_warning_ratio: float | None = None,
          kv_held_s: float = 0.0) -> dict[str, Any]:
    """The figure of a timeline document; ``kv_held_s``: how long a KV source holds a busy
    pool's value unsampled (``sampling.kv_interval_s``): KV lines break only beyond that
    (:func:`vramscope.dashboard.timeline.gap_after_s`)."""
    s = doc["series"]
    judged = doc.get("floor") or {}
    floor: dict[str, list[Any]] = {"ts": [t for t, _ in judged.get("points") or []],
                                   "min": [b for _, b in judged.get("points") or []]}
    lo, hi, limit = memory_range(s, floor["min"])
    # the floor is one process's: where the device has several, the legend says whose
    floor_of = judged.get("process") if doc.get("mixed_processes") else None
    shares = doc.get("phase_shares") or {}
    frag = f._fragmentation_traces(s)
    several = bool(doc.get("several_kv_pools"))
    pool_lines = (serving.kv_pool_traces(doc.get("kv_pools") or [], doc["bucket_s"], kv_held_s)
                  if several else [])
    kv = pool_lines or serving.kv_steps(f._kv_traces(s), s, doc["bucket_s"], kv_held_s)
    if several and not pool_lines:  # several pools, none read apart (too many raw rows)
        kv = serving.mixed_pools(kv, len(doc.get("kv_pool_pids") or []))
    load = serving.load_traces(doc.get("load") or {}, doc["bucket_s"])
    prefix = serving.prefix_traces(doc.get("prefix_cache"), doc["bucket_s"])
    tokens = serving.token_traces(doc.get("tokens"), doc["bucket_s"])
    markers = _ordered_markers(f._marker_traces(doc))
    rate = _rate_traces(doc, markers)
    panels = [p for p, present in (("memory", True), ("phases", bool(shares.get("ts"))),
                                   ("fragmentation", bool(frag)), ("kv", bool(kv)),
                                   ("load", bool(load)), ("prefix", bool(prefix)),
                                   ("tokens", bool(tokens)),
                                   ("requests", bool(rate)),
                                   ("markers", bool(markers)))
              if present]
    top = max(hi, (limit or 0) / GIB) * 1.05
    data = (f.band_traces(doc["phases"], top) + _off_axis(memory_traces(doc), lo, hi)
            + _floor_traces(floor, floor_of)
            + _share_traces(shares) + _restyle_fragmentation(frag) + kv + load + prefix
            + tokens + rate + markers)
    layout = f._layout(
        height=320 + 110 * len(panels), showlegend=True, hovermode="x", uirevision="timeline",
        margin={"l": 64, "r": 24, "t": 36, "b": 48},
        legend={"orientation": "v", "x": 1.06, "xanchor": "left", "y": 1.0, "yanchor": "top",
                "traceorder": "normal"},
        xaxis={"type": "date", "range": [f.ms(doc["start"]), f.ms(doc["end"])],
               "anchor": PANEL_AXIS[panels[-1]].replace("axis", ""), "showspikes": True,
               "tickformatstops": TICK_FORMATS, "title": {"text": _date_title(doc)}},
        updatemenus=_range_buttons(lo, hi, top, limit),
        meta={"phase_source": doc["phase_source"], "bucket_s": doc["bucket_s"],
              "events_truncated": doc["events_truncated"],
              "window_age_s": doc.get("window_age_s"), "window_end": doc["end"],
              "stale_after_s": doc.get("stale_after_s"),
              "memory_range_gib": [lo, hi], "limit_gib": limit and limit / GIB,
              "mixed_processes_note": doc.get("mixed_processes_note"),
              "kv_pools_note": doc.get("kv_pools_note")})
    axes = _axes(panels, s, lo, hi, fragmentation_warning_ratio, {t["name"] for t in markers},
                 (doc.get("prefix_cache") or {}).get("hit_rate"), bool(pool_lines))
    axes["annotations"] = _floor_note(floor) + axes.get("annotations", [])
    layout.update(axes)
    return {"data": f.drawn_in_legend(data), "layout": layout}


def memory_traces(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Allocated, reserved, device used, the limit and the largest free block. Where the
    window mixes several processes (``mixed_processes``), allocated and reserved are drawn per
    process (a colour each, allocated solid and reserved dashed, the legend naming the process
    and saying "ended" of one that ended) where the document has per-process series, and
    before them (``processes_from``; all of the window where there are none) as a band per
    bucket between the least and the greatest process, labelled as that: never one line
    labelled "allocated" over several processes. NVML's device used stays device-wide."""
    s = doc["series"]
    if not doc.get("mixed_processes"):
        return f._memory_traces(s)
    shared = {k: v for k, v in s.items() if k not in PROCESS_COLUMNS}
    return (_process_traces(doc.get("processes") or [])
            + _mixed_bands(s, doc.get("processes_from")) + f._memory_traces(shared))


def _process_traces(procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, p in enumerate(procs):
        color = f.PROCESS_COLORS[i % len(f.PROCESS_COLORS)]
        who = f.text(p["process"])
        for key, what, dash in (("allocated_bytes", "allocated", "solid"),
                                ("reserved_bytes", "reserved", "dash")):
            part = p["series"].get(key)
            if not part:
                continue
            name = f"{who} · {what}" + (" · ended" if p["ended"] else "")
            out.append(f._line(name, f._xs(part), f.gib(part["max"]), color,
                               line={"color": color, "width": 1.6, "dash": dash},
                               legendgroup=f"process {p['pid']}", xaxis="x", yaxis="y",
                               hovertemplate="%{y:.2f} GiB"))
    return out


def _mixed_bands(s: dict[str, dict[str, list[Any]]], before: float | None
                 ) -> list[dict[str, Any]]:
    """Allocated and reserved of several processes as each bucket's range over them (the
    tiers' minimum and maximum), in the buckets that start before ``before`` (None: all)."""
    out = []
    for key, (name, color, fill) in MIXED_STYLE.items():
        part = s.get(key)
        if not part:
            continue
        kept = [i for i, t in enumerate(part["ts"]) if before is None or t < before]
        if not kept:
            continue
        xs = [f.ms(part["ts"][i]) for i in kept]
        lows = f.gib([part["min"][i] for i in kept])
        highs = f.gib([part["max"][i] for i in kept])
        out += [f._line(f"{name}: least", xs, lows, color, line={"color": color, "width": 0.6},
                        legendgroup=key, showlegend=False, xaxis="x", yaxis="y",
                        hovertemplate="%{y:.2f} GiB, the lowest of any process"),
                f._line(name, xs, highs, color, line={"color": color, "width": 1.2},
                        fill="tonexty", fillcolor=fill, legendgroup=key, xaxis="x", yaxis="y",
                        hovertemplate="%{y:.2f} GiB, the highest of any process")]
    return out


def memory_range(s: dict[str, dict[str, list[Any]]], floor: list[Any] | None = None
                 ) -> tuple[float, float, int | None]:
    """``(low, high)`` GiB around allocated, reserved, device used and the judged ``floor``
    (residual where KV explains part of the memory: it may lie under allocated, and a leak
    must show), the limit only when it is near them; and the limit in bytes."""
    keys = ("allocated_bytes", "reserved_bytes", "device_used_bytes")
    values = [v for k in keys if k in s for part in ("min", "max") for v in s[k][part]
              if v is not None] + [v for v in floor or () if v is not None]
    limits = s.get("device_total_bytes", {}).get("max") or []
    limit = max((v for v in limits if v), default=None)
    if not values:
        return 0.0, (limit or GIB) / GIB * 1.04, limit
    low, high = min(values), max(values)
    if limit and limit <= high * LIMIT_NEAR:
        high = max(high, limit)
    pad = max((high - low) * 0.08, 0.05 * GIB)
    return max(0.0, (low - pad) / GIB), (high + pad) / GIB, limit


def _range_buttons(lo: float, hi: float, top: float, limit: int | None) -> list[dict[str, Any]]:
    if not limit:
        return []
    return [{"type": "buttons", "direction": "right", "showactive": True, "active": 0,
             "x": 0.0, "xanchor": "left", "y": 1.0, "yanchor": "bottom", "pad": {"b": 4},
             "font": {"size": 11}, "bgcolor": "#ffffff", "bordercolor": "#d0d7de",
             "buttons": [{"label": "Fit the data", "method": "relayout",
                          "args": [{"yaxis.range": [lo, hi]}]},
                         {"label": "0 to the limit", "method": "relayout",
                          "args": [{"yaxis.range": [0, top]}]}]}]


def _off_axis(traces: list[dict[str, Any]], lo: float, hi: float) -> list[dict[str, Any]]:
    """Memory curves with no point on the fitted axis (a fragmented device's largest free block,
    far under allocated) draw nothing until "0 to the limit": they leave the legend. The limit
    stays, as the button names it."""
    for t in traces:
        if t["name"] != "limit" and not any(y is not None and lo <= y <= hi for y in t["y"]):
            t["showlegend"] = False
    return traces


def _floor_traces(floor: dict[str, list[Any]], process: str | None) -> list[dict[str, Any]]:
    if len(floor["ts"]) < 2:
        return []
    name = FLOOR_NAME + (f" · {f.text(process)}" if process else "")
    return [f._line(name, [f.ms(t) for t in floor["ts"]],
                    f.gib(floor["min"]), "#0a3069",
                    line={"color": "#0a3069", "width": 2.2, "dash": "dot"},
                    xaxis="x", yaxis="y", hovertemplate="floor %{y:.3f} GiB")]


def _floor_note(floor: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """"floor +1.06 GiB since 21:10": the growth a leak makes, in words on the plot."""
    if len(floor["ts"]) < 2:
        return []
    # a window that opens before the model is in memory would count the load as growth: the
    # growth is taken from the first floor of at least half the last one (the agent's own
    # reload rule: under half the settled floor, the weights are not in yet)
    values = [v for v in floor["min"] if v is not None]
    if len(values) < 2:
        return []
    settled = next(i for i, v in enumerate(values) if v >= values[-1] / 2)
    growth = values[-1] - values[settled]
    since = "over this window" if settled == 0 else "after the model load"
    text = f"idle floor {'+' if growth >= 0 else '−'}{_size(abs(growth))} {since}"
    return [{"xref": "paper", "yref": "paper", "x": 1.0, "y": 1.0, "xanchor": "right",
             "yanchor": "bottom", "showarrow": False, "text": text,
             "font": {"size": 12, "color": "#0a3069"}}]


def _size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.0f} MiB"


def _share_traces(shares: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Each phase's share of a bucket as a stacked bar on the phase lane."""
    if not shares.get("ts"):
        return []
    xs = [f.ms(t) for t in shares["ts"]]
    width = (xs[1] - xs[0]) if len(xs) > 1 else 1000.0
    return [{"type": "bar", "name": f"{p} share", "x": xs, "y": shares[p],
             "width": width, "offset": 0, "marker": {"color": PHASE_SHARE_COLORS.get(p, "#999"),
                                                     "line": {"width": 0}},
             "xaxis": "x", "yaxis": "y6", "hovertemplate": f"{p} %{{y:.0%}}"}
            for p in shares if p != "ts"]


def _rate_traces(doc: dict[str, Any], markers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Requests started per minute, where the request markers cannot show them: a window
    with more than the page draws ("zoom in"), or one whose request events retention has
    deleted (their counts per minute stay: ``event_counts``)."""
    rate = doc.get("request_rate")
    if not rate or not any(rate["per_min"]):
        return []
    if not doc["events_truncated"] and any(t["name"] == "request start" for t in markers):
        return []
    width = rate["bucket_s"] * 1000.0
    return [{"type": "bar", "name": "requests / min", "x": [f.ms(t) for t in rate["ts"]],
             "y": rate["per_min"], "width": width, "offset": 0,
             "marker": {"color": REQUEST_COLOR, "line": {"width": 0}}, "xaxis": "x",
             "yaxis": "y7",
             "hovertemplate": f"%{{y:.1f}} requests started a minute "
                              f"({rate['bucket_s'] / 60:g} min buckets)<extra></extra>"}]


def _restyle_fragmentation(traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """External fragmentation in a neutral colour (a high value is not by itself a risk)."""
    for t in traces:
        if t["name"] == "external fragmentation":
            t["line"] = {"color": "#6e7781", "width": 1.2}
            t["marker"] = {"size": 3, "color": "#6e7781"}
            t["hovertemplate"] = "%{y:.2f} of cached free outside the largest block"
    return traces


def _ordered_markers(traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start and end of requests as thin ticks in two colours, lanes in a fixed order."""
    for t in traces:
        if t["name"] in ("request start", "request end"):
            color = "#2da44e" if t["name"] == "request start" else "#8c959f"
            t["marker"] = {"symbol": "line-ns", "size": 9, "line": {"width": 1, "color": color},
                           "color": color}
    return sorted(traces, key=lambda t: MARKER_ORDER.index(t["name"])
                  if t["name"] in MARKER_ORDER else len(MARKER_ORDER))


def _date_title(doc: dict[str, Any]) -> str:
    from vramscope.agent.timefmt import iso_utc

    first, last = iso_utc(doc["start"], ms=False)[:10], iso_utc(doc["end"], ms=False)[:10]
    return f"time (UTC), {first}" + ("" if first == last else f" – {last}")


def _domains(panels: list[str]) -> dict[str, list[float]]:
    total = sum(PANEL_WEIGHTS[p] for p in panels)
    gaps = [0.0] + [GAP_ABOVE.get(p, GAP) for p in panels[1:]]
    usable = 1.0 - sum(gaps)
    out, top = {}, 1.0
    for p, gap in zip(panels, gaps):
        top -= gap
        height = usable * PANEL_WEIGHTS[p] / total
        out[p] = [max(0.0, round(top - height, 4)), round(top, 4)]
        top -= height
    return out


def _axes(panels: list[str], s: dict[str, dict[str, list[Any]]], lo: float, hi: float,
          frag_warning: float | None, markers: set[str],
          hit_rate: float | None = None, several_pools: bool = False) -> dict[str, Any]:
    dom = _domains(panels)
    axes: dict[str, Any] = {
        "yaxis": {"domain": dom["memory"], "title": {"text": "memory (GiB)"},
                  "range": [lo, hi], "ticksuffix": " "}}
    if "phases" in dom:
        axes["yaxis6"] = {"domain": dom["phases"], "range": [0, 1], "fixedrange": True,
                          "tickvals": [0, 1], "ticktext": ["0", "100 %"],
                          "title": {"text": "phase", "font": {"size": 11}}}
        axes["barmode"] = "stack"
        axes["bargap"] = 0
    if "fragmentation" in dom:
        title = "fragmentation"
        axes["yaxis2"] = {"domain": dom["fragmentation"], "title": {"text": title},
                          "range": [0, 1.02], "tickformat": ".0%"}
        axes.setdefault("shapes", []).extend(_frag_threshold(frag_warning))
        axes.setdefault("annotations", []).append(_frag_note(dom["fragmentation"]))
    if "kv" in dom and several_pools:
        # each pool against its own size (docs/dashboard.md, "Several servers, several pools")
        axes["yaxis3"] = {"domain": dom["kv"], "range": [0, 1.05], "tickformat": ".0%",
                          "tickvals": [0, 0.25, 0.5, 0.75, 1],
                          "title": {"text": "KV used<br>(each of its pool)",
                                    "font": {"size": 11}}}
    elif "kv" in dom:
        top = _occupancy_top(s)
        axes["yaxis3"] = {"domain": dom["kv"], "title": {"text": "KV blocks"},
                          "rangemode": "tozero"}
        axes["yaxis5"] = {"overlaying": "y3", "side": "right", "title": {"text": "tokens/block"},
                          "range": [0, top], "showgrid": False, "automargin": True,
                          "tickmode": "linear", "tick0": 0, "dtick": top / 4}
    if "load" in dom:
        axes["yaxis8"] = {"domain": dom["load"], "rangemode": "tozero",
                          "title": {"text": "requests", "font": {"size": 11}}}
    if "prefix" in dom:
        # vLLM's hit rate over the window: hits / queries, as stored (no query: no rate)
        title = "prefix tokens" + ("" if hit_rate is None else f"<br>hits {hit_rate:.1%}")
        axes["yaxis9"] = {"domain": dom["prefix"], "rangemode": "tozero",
                          "title": {"text": title, "font": {"size": 11}}}
        axes["barmode"] = "stack"  # the re-use on top of the hits
        axes["bargap"] = 0
    if "tokens" in dom:
        axes["yaxis10"] = {"domain": dom["tokens"], "rangemode": "tozero",
                           "title": {"text": "tokens/s", "font": {"size": 11}}}
    if "requests" in dom:
        axes["yaxis7"] = {"domain": dom["requests"], "rangemode": "tozero",
                          "title": {"text": "requests/min", "font": {"size": 11}}}
    if "markers" in dom:
        axes["yaxis4"] = {"domain": dom["markers"], "type": "category", "fixedrange": True,
                          "automargin": True, "categoryorder": "array",
                          "categoryarray": [m for m in MARKER_ORDER if m in markers]
                          + sorted(markers - set(MARKER_ORDER))}
    return axes


def _frag_threshold(ratio: float | None) -> list[dict[str, Any]]:
    if ratio is None:
        return []
    return [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y2", "y0": ratio,
             "y1": ratio, "line": {"color": "#bf8700", "dash": "dot", "width": 1}}]


def _frag_note(domain: list[float]) -> dict[str, Any]:
    return {"xref": "paper", "yref": "paper", "x": 0.0, "y": domain[1], "xanchor": "left",
            "yanchor": "bottom", "showarrow": False, "align": "left",
            "font": {"size": 11, "color": "#656d76"},
            "text": "external fragmentation: " + FRAGMENTATION_NOTE}


def _occupancy_top(s: dict[str, dict[str, list[Any]]]) -> float:
    """A round number above the fullest block (tokens per block are whole numbers)."""
    values = s.get("kv_tokens_per_block", {}).get("max") or [1.0]
    top = max(values) * 1.2
    step = 4 if top <= 40 else 20  # four ticks of whole tokens
    return float(step * -(-top // step))
