"""Pure functions from query and analysis results to Plotly figures (``{"data", "layout"}``).

No I/O and no Flask here (docs/architecture.md rule 3). Figures are plain JSON-ready dicts, so they
cost nothing to build and are what ``/api/v1/figures/*`` return; the browser hands them to
``Plotly.react``. Bytes become GiB only here; times become epoch milliseconds for date axes.
Only SVG trace types are used (no WebGL), so the page needs no ``eval``.
"""

from __future__ import annotations

from typing import Any

from vramscope.agent.event_kinds import Role, kind_of
from vramscope.agent.records import PostMortem

GIB = float(2**30)
COLORS = {
    "allocated": "#1f6feb", "reserved": "#8250df", "device_used": "#57606a",
    "limit": "#cf222e", "largest_free": "#1a7f37", "prefill": "rgba(255,159,28,0.16)",
    "decode": "rgba(46,160,67,0.10)", "idle": "rgba(140,149,159,0.08)",
    "setup": "rgba(130,80,223,0.12)",
    "split": "#bf8700", "external": "#cf222e", "kv_used": "#1f6feb", "kv_cached": "#8250df",
    "kv_total": "#57606a", "tokens": "#bf3989", "request": "#8c959f", "oom": "#cf222e",
    "retry": "#fb8500", "orphan": "#8250df", "warning": "#bf8700", "critical": "#cf222e",
}
FONT = {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12}
# one colour a process (allocated solid, reserved dashed); none of them the limit's red or
# device used's grey
PROCESS_COLORS = ("#1f6feb", "#bf3989", "#1a7f37", "#bc4c00", "#8250df", "#0a3069", "#953800",
                  "#4d2d00")


def text(value: Any) -> str:
    """A stored string as Plotly label text. Plotly renders a subset of HTML in every label,
    hover text and trace name (``<a href>``, ``<b>``, ``<br>``, ``<span style>``, entities), so a
    host named ``<a href="https://evil.example/">x</a>`` would become a link: escape ``&``, ``<``
    and ``>``; Plotly turns the entities back into the characters they stand for
    (docs/dashboard.md: server strings are text, never HTML)."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def device_label(row: dict[str, Any]) -> str:
    return text(f"{row['host']} · GPU {row['device']}")


def ms(ts_s: float) -> float:
    return ts_s * 1000.0


def gib(values: list[int | None]) -> list[float | None]:
    return [None if v is None else v / GIB for v in values]


def _layout(**extra: Any) -> dict[str, Any]:
    base = {"font": FONT, "margin": {"l": 64, "r": 24, "t": 32, "b": 40},
            "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff", "hovermode": "x unified",
            "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0}}
    base.update(extra)
    return base


def drawn_in_legend(traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``traces``, those that draw nothing kept out of the legend, which lists what shows: every
    y missing, or a line without markers whose points all stand between gaps (a largest free
    block sampled once in ten buckets: a line needs two neighbouring points)."""
    for t in traces:
        points = [x is not None and y is not None
                  for x, y in zip(t.get("x", []), t.get("y", []))]
        line_only = t.get("type") == "scatter" and t.get("mode") == "lines" \
            and not t.get("connectgaps")
        drawn = any(a and b for a, b in zip(points, points[1:])) if line_only else any(points)
        if not drawn:
            t["showlegend"] = False
    return traces


def _line(name: str, xs: list[Any], ys: list[Any], color: str, **extra: Any) -> dict[str, Any]:
    trace = {"type": "scatter", "mode": "lines", "name": name, "x": xs, "y": ys,
             "line": {"color": color, "width": 1.6}}
    trace.update(extra)
    return trace


# --- overview -----------------------------------------------------------------------------
def overview_figure(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Allocated, reserved, device used and limit per device, as grouped horizontal bars."""
    labels = [device_label(r) for r in rows]
    bars = []
    for key, name, color in (("allocated_bytes", "allocated", COLORS["allocated"]),
                             ("reserved_bytes", "reserved", COLORS["reserved"]),
                             ("device_used_bytes", "device used", COLORS["device_used"]),
                             ("device_total_bytes", "limit", COLORS["limit"])):
        values = [((r["latest"] or {}).get(key)) for r in rows]
        bars.append({"type": "bar", "orientation": "h", "name": name, "y": labels,
                     "x": gib(values), "marker": {"color": color},
                     "hovertemplate": "%{x:.2f} GiB<extra>" + name + "</extra>"})
    height = 120 + 70 * max(1, len(rows))
    return {"data": drawn_in_legend(bars), "layout": _layout(
        barmode="group", height=height, hovermode="closest",
        xaxis={"title": {"text": "GiB"}, "rangemode": "tozero"},
        yaxis={"autorange": "reversed", "automargin": True})}


def processes_figure(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each device's processes stacked under its NVML total (docs/architecture.md rule 6): one bar
    segment per process (its reserved bytes, named by its bounded label), then what no
    process explains (NVML used − their reserved: other users, CUDA contexts, memory outside
    torch), with NVML's used and total as markers. Several processes on one GPU stay apart."""
    labels = [device_label(r) for r in rows]
    names: dict[str, None] = {}
    per_row: list[dict[str, int]] = []
    for r in rows:
        mine: dict[str, int] = {}
        for p in (r["latest"] or {}).get("processes") or ():
            if p.get("reserved_bytes") is not None:
                label = text(p.get("process") or "unknown")
                mine[label] = mine.get(label, 0) + p["reserved_bytes"]
                names[label] = None
        per_row.append(mine)
    data: list[dict[str, Any]] = [  # Plotly traces: JSON
        {"type": "bar", "orientation": "h", "name": name, "y": labels,
         "x": gib([m.get(name) for m in per_row]),
         "hovertemplate": "%{x:.2f} GiB<extra>%{fullData.name}</extra>"} for name in names]
    latest = [r["latest"] or {} for r in rows]
    data.append({"type": "bar", "orientation": "h", "name": "unexplained", "y": labels,
                 "x": gib([lt.get("unexplained_bytes") for lt in latest]),
                 "marker": {"color": "rgba(140,149,159,0.55)", "pattern": {"shape": "/"}},
                 "hovertemplate": "%{x:.2f} GiB<extra>unexplained</extra>"})
    for key, name, color, symbol in (
            ("device_used_bytes", "device used (NVML)", COLORS["device_used"], "line-ns-open"),
            ("device_total_bytes", "device total", COLORS["limit"], "line-ns")):
        data.append({"type": "scatter", "mode": "markers", "name": name, "y": labels,
                     "x": gib([lt.get(key) for lt in latest]),
                     "marker": {"color": color, "symbol": symbol, "size": 18,
                                "line": {"width": 3, "color": color}},
                     "hovertemplate": "%{x:.2f} GiB<extra>" + name + "</extra>"})
    return {"data": drawn_in_legend(data), "layout": _layout(
        barmode="stack", height=120 + 70 * max(1, len(rows)), hovermode="closest",
        xaxis={"title": {"text": "GiB"}, "rangemode": "tozero"},
        yaxis={"autorange": "reversed", "automargin": True})}


# --- device timeline ------------------------------------------------------------------------
def _xs(series: dict[str, list[Any]]) -> list[float]:
    return [ms(t) for t in series["ts"]]


def _memory_traces(s: dict[str, dict[str, list[Any]]]) -> list[dict[str, Any]]:
    out = []
    for key, name, color, dash in (
            ("allocated_bytes", "allocated", COLORS["allocated"], "solid"),
            ("reserved_bytes", "reserved", COLORS["reserved"], "solid"),
            ("device_used_bytes", "device used", COLORS["device_used"], "solid"),
            ("device_total_bytes", "limit", COLORS["limit"], "dash"),
            ("largest_free_block_bytes", "largest free block", COLORS["largest_free"], "dot")):
        if key in s:
            out.append(_line(name, _xs(s[key]), gib(s[key]["max"]), color,
                             line={"color": color, "width": 1.6, "dash": dash},
                             xaxis="x", yaxis="y", hovertemplate="%{y:.2f} GiB"))
    return out


def _fragmentation_traces(s: dict[str, dict[str, list[Any]]]) -> list[dict[str, Any]]:
    out = []
    for key, name, color in (("inactive_split_ratio", "inactive split ratio", COLORS["split"]),
                             ("external_fragmentation", "external fragmentation",
                              COLORS["external"])):
        if key in s:
            mode = "lines" if key == "inactive_split_ratio" else "lines+markers"
            out.append(_line(name, _xs(s[key]), s[key]["max"], color, mode=mode,
                             marker={"size": 4}, xaxis="x", yaxis="y2",
                             hovertemplate="%{y:.3f}"))
    return out


def _kv_traces(s: dict[str, dict[str, list[Any]]]) -> list[dict[str, Any]]:
    out = []
    for key, name, color in (("kv_blocks_used", "KV blocks used", COLORS["kv_used"]),
                             ("kv_blocks_cached", "KV blocks cached", COLORS["kv_cached"]),
                             ("kv_blocks_total", "KV blocks total", COLORS["kv_total"])):
        if key in s:
            out.append(_line(name, _xs(s[key]), s[key]["max"], color, xaxis="x", yaxis="y3",
                             line={"color": color, "width": 1.6,
                                   "dash": "dash" if key == "kv_blocks_total" else "solid"}))
    if "kv_tokens_per_block" in s:
        out.append(_line("tokens per used block", _xs(s["kv_tokens_per_block"]),
                         s["kv_tokens_per_block"]["max"], COLORS["tokens"], xaxis="x",
                         yaxis="y5", line={"color": COLORS["tokens"], "width": 1, "dash": "dot"},
                         hovertemplate="%{y:.1f} tokens/block"))
    return out


# each marker lane label's symbol and colour; a label without one (an event given the marker
# role in agent/event_kinds.py and no style yet) is drawn as MARKER_DEFAULT, never a KeyError
MARKER_STYLES = {"request start": ("triangle-right", COLORS["request"]),
                 "request end": ("triangle-left", COLORS["request"]),
                 "alloc retries": ("diamond", COLORS["retry"]), "OOM": ("x", COLORS["oom"]),
                 "alert fired": ("triangle-up", COLORS["warning"]),
                 "orphaned KV blocks": ("square", COLORS["orphan"]),
                 "process exit": ("line-ns-open", COLORS["request"])}
MARKER_DEFAULT = ("circle-open", COLORS["request"])


def _marker_traces(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Requests, allocator retries, OOMs, orphaned KV blocks and process exits on one lane
    (y4)."""
    groups: dict[str, tuple[list[Any], list[Any]]] = {}
    for e in doc["events"]:
        kind = kind_of(e["name"])  # the label of agent/event_kinds.py
        if Role.MARKER not in kind.roles:  # a name the timeline reads but draws no marker of
            continue
        label = kind.label
        xs, texts = groups.setdefault(label, ([], []))
        xs.append(ms(e["ts"]))
        hover = e["request_id"] or e["message"]
        if hover is None and e["name"] == "process_exit":
            hover = f"pid {e.get('pid')} exited"
        texts.append(text(hover or ""))
    for r in doc.get("retries", ()):
        xs, texts = groups.setdefault("alloc retries", ([], []))
        xs.append(ms(r["ts"]))
        texts.append(f"+{r['count']} retries")
    for a in doc.get("alerts", ()):
        xs, texts = groups.setdefault("alert fired", ([], []))
        xs.append(ms(a["ts"]))
        texts.append(text(f"{a['severity']}: {a['rule']}: {a['message'] or ''}"[:200]))
    out = []
    for label, (xs, texts) in groups.items():
        symbol, color = MARKER_STYLES.get(label, MARKER_DEFAULT)
        out.append({"type": "scatter", "mode": "markers", "name": label, "x": xs,
                    "y": [label] * len(xs), "text": texts, "hovertemplate": "%{text}",
                    "marker": {"symbol": symbol, "color": color,
                               "size": 11 if label == "OOM" else 7},
                    "xaxis": "x", "yaxis": "y4"})
    return out


def band_traces(bands: list[dict[str, Any]], top: float) -> list[dict[str, Any]]:
    """Prefill, decode and setup (a KV pool allocated and warmed up) as shaded bands behind the
    memory curves: one filled trace per phase (rectangles separated by gaps), far cheaper for
    the browser than hundreds of shapes."""
    out = []
    for phase in ("prefill", "decode", "setup"):
        xs: list[float | None] = []
        ys: list[float | None] = []
        for b in bands:
            if b["phase"] == phase:
                x0, x1 = ms(b["start"]), ms(b["end"])
                xs += [x0, x0, x1, x1, None]
                ys += [0, top, top, 0, None]
        if xs:
            out.append({"type": "scatter", "mode": "none", "name": phase, "x": xs, "y": ys,
                        "fill": "toself", "fillcolor": COLORS[phase], "hoverinfo": "skip",
                        "xaxis": "x", "yaxis": "y"})
    return out


# --- leaks, risk, capacity --------------------------------------------------------------------
def leaks_figure(floor: list[tuple[float, int]], trend_line: Any,
                 limit_bytes: int | None, window: tuple[float, float] | None = None,
                 name: str = "idle floor", trend_name: str = "trend (Theil–Sen)"
                 ) -> dict[str, Any]:
    """The floor (the idle floor, or the bytes a KV pool's orphaned blocks hold) with the
    verdict's trend line. ``window``: the time axis when nothing is drawn (an empty date
    axis would otherwise open on 1 January 2000)."""
    data = [_line(name, [ms(t) for t, _ in floor], gib([b for _, b in floor]),
                  COLORS["allocated"], mode="lines+markers", marker={"size": 4},
                  hovertemplate="%{y:.3f} GiB")]
    if trend_line:
        (t0, y0), (t1, y1) = trend_line
        data.append(_line(trend_name, [ms(t0), ms(t1)], [y0 / GIB, y1 / GIB],
                          COLORS["limit"], line={"color": COLORS["limit"], "dash": "dash",
                                                 "width": 2}))
    xaxis: dict[str, Any] = {"type": "date"}
    if not floor and not trend_line and window is not None:
        xaxis["range"] = [ms(window[0]), ms(window[1])]
    return {"data": drawn_in_legend(data), "layout": _layout(
        height=380, xaxis=xaxis, yaxis={"title": {"text": f"{name} (GiB)"}},
        meta={"limit_bytes": limit_bytes})}


def risk_figure(headroom: dict[str, list[Any]], forecast: dict[str, list[Any]] | None,
                warnings: list[dict[str, Any]], limit_bytes: int | None,
                levels: dict[str, float],
                tto_warning_s: float = 1800.0) -> dict[str, Any]:
    """Headroom under the limit, the time-to-OOM forecast and when each warning fired.

    The threshold lines carry their names; the time-to-OOM axis stops at the 90th percentile
    of the forecast (at least twice ``alerts.time_to_oom_warning_s``), so one early 140 h
    forecast cannot flatten the ones that matter."""
    data = [_line("headroom", [ms(t) for t in headroom["ts"]], gib(headroom["bytes"]),
                  COLORS["allocated"], fill="tozeroy", fillcolor="rgba(31,111,235,0.08)",
                  hovertemplate="%{y:.2f} GiB")]
    if forecast and forecast["ts"]:
        hours = [None if v is None else v / 3600.0 for v in forecast["time_to_oom_s"]]
        band = _forecast_band(forecast)
        data += band
        data.append(_line("time to OOM", [ms(t) for t in forecast["ts"]], hours,
                          COLORS["critical"], yaxis="y2", hovertemplate="%{y:.2f} h"))
    for level in ("warning", "critical"):
        mine = [w for w in warnings if w["severity"] == level]
        if mine:
            data.append({"type": "scatter", "mode": "markers", "name": f"{level} fired",
                         "x": [ms(w["ts"]) for w in mine], "y": [0] * len(mine),
                         "text": [text(w["label"]) for w in mine], "hovertemplate": "%{text}",
                         "cliponaxis": False,
                         "marker": {"symbol": "triangle-up", "size": 12,
                                    "color": COLORS[level]}})
    shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y",
               "y0": limit_bytes * ratio / GIB, "y1": limit_bytes * ratio / GIB,
               "line": {"color": COLORS[name], "dash": "dot", "width": 1}}
              for name, ratio in levels.items() if limit_bytes]
    notes = [{"xref": "paper", "x": 0.0, "xanchor": "left", "yref": "y",
              "y": limit_bytes * ratio / GIB, "yanchor": "bottom", "showarrow": False,
              "text": f"{name}: headroom under {ratio:.0%} of the limit",
              "font": {"size": 10, "color": COLORS[name]}}
             for name, ratio in levels.items() if limit_bytes]
    return {"data": drawn_in_legend(data), "layout": _layout(
        height=420, shapes=shapes, annotations=notes, xaxis={"type": "date"},
        yaxis={"title": {"text": "headroom (GiB)"}, "rangemode": "tozero"},
        yaxis2={"title": {"text": "time to OOM (h)"}, "overlaying": "y", "side": "right",
                "range": [0, _tto_top_h(forecast, tto_warning_s)], "showgrid": False,
                "automargin": True, "tickmode": "auto", "nticks": 7})}


def _tto_top_h(forecast: dict[str, list[Any]] | None, warning_s: float) -> float:
    values = sorted(v for v in (forecast or {}).get("time_to_oom_s", []) if v is not None)
    p90 = values[int(0.9 * (len(values) - 1))] if values else 0.0
    return max(2 * warning_s, p90) * 1.1 / 3600.0


def _forecast_band(forecast: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The forecast's uncertainty as two dotted lines (soonest, latest); a filled band would
    smear across the gaps where the model makes no forecast."""
    lo, hi = forecast.get("low_s"), forecast.get("high_s")
    if not lo or not hi:
        return []
    xs = [ms(t) for t in forecast["ts"]]

    def to_h(vs: list[float | None]) -> list[float | None]:
        return [None if v is None else v / 3600.0 for v in vs]

    style: dict[str, Any] = {"color": "rgba(207,34,46,0.45)", "width": 1, "dash": "dot"}
    return [_line("forecast soonest", xs, to_h(lo), style["color"], yaxis="y2", line=style,
                  hovertemplate="%{y:.2f} h"),
            _line("forecast latest", xs, to_h(hi), style["color"], yaxis="y2", line=style,
                  hovertemplate="%{y:.2f} h")]


def capacity_figure(capacity: dict[str, Any]) -> dict[str, Any]:
    """Measured peaks per device, and the estimate in a column of its own beside the memory it
    was sized against and what is usable after the margin: the estimate is compared with that
    GPU, not drawn against every device's limit."""
    rows = capacity["devices"]
    labels = [device_label(r) for r in rows]
    estimate = capacity.get("estimate") or {}
    extra = [f"estimate: {capacity['shape'].get('name', 'model')}"] if estimate else []
    data = []
    for key, name, color in (("allocated_bytes", "peak allocated", COLORS["allocated"]),
                             ("reserved_bytes", "peak reserved", COLORS["reserved"]),
                             ("device_used_bytes", "peak device used", COLORS["device_used"]),
                             ("device_total_bytes", "limit", COLORS["limit"])):
        values = [(r["peaks"] or {}).get(key) for r in rows]
        if extra:
            values.append(estimate.get("gpu_memory_bytes") if key == "device_total_bytes"
                          else None)
        data.append({"type": "bar", "name": name, "x": labels + extra, "y": gib(values),
                     "marker": {"color": color}, "hovertemplate": "%{y:.2f} GiB"})
    for key, name, color in (("usable_bytes", "usable after margin", COLORS["largest_free"]),
                             ("total_bytes", "estimate", COLORS["warning"])):
        if extra and estimate.get(key):
            data.append({"type": "bar", "name": name, "x": labels + extra,
                         "y": [None] * len(rows) + [estimate[key] / GIB],
                         "marker": {"color": color}, "hovertemplate": "%{y:.2f} GiB"})
    return {"data": drawn_in_legend(data),
            "layout": _layout(barmode="group", height=380, hovermode="closest",
                              yaxis={"title": {"text": "GiB"}})}


# --- post-mortems ---------------------------------------------------------------------------
def segment_map_figure(pm: PostMortem) -> dict[str, Any]:
    """Each segment as a bar: allocated, its largest hole, and the rest of its free bytes.

    A segment map of small scattered holes (lots of "other free", little "largest hole") is
    what fragmentation looks like: free memory no large request can use.
    """
    segs = list(pm.segments)
    labels = [f"seg {i}" for i in range(len(segs))]
    used = [_first_int(s, "allocated_bytes", "allocated_size", "allocated") for s in segs]
    total = [_first_int(s, "total_size_bytes", "total_size", "size_bytes", "size") for s in segs]
    hole = [min(_first_int(s, "largest_free_block_bytes"), max(0, t - u))
            for s, t, u in zip(segs, total, used)]
    rest = [max(0, t - u - h) for t, u, h in zip(total, used, hole)]

    def mib(vs: list[int]) -> list[float]:
        return [v / 2**20 for v in vs]

    parts = (("allocated", used, COLORS["allocated"]), ("largest hole", hole, "#8c959f"),
             ("other free", rest, "#d0d7de"))
    data = [{"type": "bar", "orientation": "h", "name": name, "y": labels, "x": mib(values),
             "marker": {"color": color}, "hovertemplate": "%{x:.1f} MiB"}
            for name, values, color in parts]
    return {"data": data, "layout": _layout(
        barmode="stack", height=140 + 12 * max(1, len(segs)), hovermode="closest",
        xaxis={"title": {"text": "MiB"}}, yaxis={"autorange": "reversed"})}


def _first_int(segment: dict[str, Any], *keys: str) -> int:
    """Segment maps come torch-shaped (``total_size``) or compact (``size``): take either."""
    for key in keys:
        value = segment.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return 0


def holders_figure(pm: PostMortem) -> dict[str, Any]:
    """The top holders by size; the innermost frame names each."""
    holders = list(pm.top_holders)
    labels = [text(f"#{i + 1} {h.frames[0] if h.frames else '(no stack)'}"[:80])
              for i, h in enumerate(holders)]
    return {"data": [{"type": "bar", "orientation": "h", "name": "held",
                      "y": labels, "x": [h.size_bytes / 2**20 for h in holders],
                      "marker": {"color": COLORS["reserved"]}, "hovertemplate": "%{x:.1f} MiB"}],
            "layout": _layout(height=140 + 24 * max(1, len(holders)), hovermode="closest",
                              showlegend=False, xaxis={"title": {"text": "MiB"}},
                              yaxis={"autorange": "reversed", "automargin": True})}
