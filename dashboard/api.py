"""``/api/v1``: the JSON API, described by ``/api/v1/openapi.json``
(:mod:`vramscope.dashboard.openapi`).

Handlers parse parameters with :mod:`vramscope.dashboard.params` (a bad one is a 400 naming it),
read
through :mod:`vramscope.dashboard.queries`, and return plain JSON. ``/api/v1/figures/*`` return
Plotly
figures built by the pure functions of :mod:`vramscope.dashboard.figures`; the pages draw those.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, jsonify, send_file
from flask.typing import ResponseReturnValue
from vramscope.agent.dtypes import element_bytes, known_dtypes
from vramscope.agent.records import PostMortem
from vramscope.agent.store import Store
from vramscope.dashboard import (
    figures,
    fleet,
    params,
    postmortem_view,
    queries,
    timeline_figure,
    verdict,
    verdict_views,
    views,
)
from vramscope.dashboard import timeline as tl
from vramscope.dashboard.alert_text import metrics_by_rule
from vramscope.dashboard.errors import BadParameter
from vramscope.dashboard.state import state
from werkzeug.exceptions import NotFound

bp = Blueprint("api", __name__)

DEFAULT_SPAN_S = 3600.0
MAX_DEVICE = 4095


def _host() -> str | None:
    return queries.host_or_none(state().store, params.text("host"))


def _device() -> int:
    return params.integer("device", 0, low=0, high=MAX_DEVICE)


@bp.get("/openapi.json")
def openapi_document() -> ResponseReturnValue:
    from vramscope.dashboard.openapi import document

    return jsonify(document())


@bp.get("/hosts")
def hosts() -> ResponseReturnValue:
    return jsonify({"hosts": queries.host_rows(state().store)})


@bp.get("/freshness")
def freshness() -> ResponseReturnValue:
    """How old the newest sample of any device is, and whether that counts as stale."""
    st = state()
    return jsonify(queries.freshness_now(st.store, st.config, st.clock.time_s()))


@bp.get("/devices")
def devices() -> ResponseReturnValue:
    """Every device; with ``host`` and ``device`` both given, that one device's row only."""
    st = state()
    host, device = params.text("host"), params.integer("device", None, low=0, high=MAX_DEVICE)
    only = (host or st.store.host_name, device) if device is not None else None
    return jsonify({"devices": queries.device_rows(st.store, st.config, st.clock.time_s(),
                                                   only=only)})


@bp.get("/processes")
def processes() -> ResponseReturnValue:
    st = state()
    return jsonify({"processes": queries.process_rows(st.store, None, st.config,
                                                      st.clock.time_s())})


@bp.get("/fleet")
def fleet_devices() -> ResponseReturnValue:
    """Every device of every host in the order that needs attention, and grouped by host;
    ``host`` and ``model`` (the GPU's name) filter (empty: every one)."""
    st = state()
    return jsonify(fleet.document(st.store, st.config, st.clock.time_s(),
                                  host=params.text("host") or None,
                                  model=params.text("model", max_len=96) or None))


@bp.get("/overview")
def overview() -> ResponseReturnValue:
    """With ``figures=true`` the overview page's two figures come in the same document, built
    from the same device rows: one computation per refresh instead of three."""
    st = state()
    with_figures = params.boolean("figures")
    doc = queries.overview(st.store, st.config, st.clock.time_s())
    if with_figures:
        doc["figures"] = {"overview": figures.overview_figure(doc["devices"]),
                          "processes": figures.processes_figure(doc["devices"])}
    return jsonify(doc)


def _latest(store: Store, device: int, host: str | None) -> float | None:
    """The newest sample's time, read only when the request leaves ``end`` out."""
    if params.number("end", low=0, high=1e11) is not None:
        return None
    span = store.time_range(device, host)
    return span[1] if span else state().clock.time_s()  # no data yet: end now


def _known_device(store: Store, device: int, host: str | None) -> int:
    """``device`` when the host has reported it; else a 404 naming both (an empty series
    would read as "no data in this window")."""
    known = store.devices(host=host)
    if not any(d["device_index"] == device for d in known):
        name = host or store.host_name
        raise NotFound(f"no device {device} on host {name}" if known
                       else f"no device has reported on host {name} yet")
    return device


def _timeline_doc() -> dict[str, Any]:
    st = state()
    store, host = st.store, _host()
    device = _known_device(store, _device(), host)
    start, end = params.time_window(DEFAULT_SPAN_S, _latest(store, device, host))
    max_points = params.integer("max_points", params.DEFAULT_MAX_POINTS, low=1,
                                high=params.MAX_POINTS_LIMIT)
    columns = params.choices("columns", tl.TIMELINE_COLUMNS, tl.TIMELINE_COLUMNS)
    doc = queries.timeline(store, device, host, start, end, max_points, columns)
    # how far the window's end lies behind now: an old window must not pass for the present
    doc["window_age_s"] = max(0.0, st.clock.time_s() - end)
    doc["stale_after_s"] = verdict.stale_after_s(st.config)
    return doc


@bp.get("/timeline")
def timeline() -> ResponseReturnValue:
    return jsonify(_timeline_doc())


@bp.get("/alerts")
def alerts() -> ResponseReturnValue:
    active = params.boolean("active", False)
    limit = params.integer("limit", 500, low=1, high=10_000)
    st = state()
    rows = st.store.alerts(active_only=active, host=params.text("host"), limit=limit)
    metrics = metrics_by_rule(st.config)
    return jsonify({"alerts": [queries.alert_json(a, metrics) for a in rows]})


def _postmortems() -> list[tuple[int, PostMortem]]:
    device = params.integer("device", None, low=0, high=MAX_DEVICE)
    return state().store.postmortems(device, host=params.text("host", "*"))


@bp.get("/postmortems")
def postmortems() -> ResponseReturnValue:
    st = state()
    return jsonify({"postmortems": [
        postmortem_view.postmortem_json(i, pm, st.store.host_name, st.config["hooks.snapshot_dir"])
        for i, pm in _postmortems()]})


def _postmortem(pm_id: int) -> PostMortem:
    for i, pm in state().store.postmortems(host="*"):
        if i == pm_id:
            return pm
    raise NotFound(f"no post-mortem with id {pm_id}")


@bp.get("/postmortems/<int:pm_id>")
def postmortem(pm_id: int) -> ResponseReturnValue:
    st = state()
    return jsonify(postmortem_view.postmortem_json(pm_id, _postmortem(pm_id), st.store.host_name,
                                           st.config["hooks.snapshot_dir"]))


@bp.get("/postmortems/<int:pm_id>/snapshot")
def postmortem_snapshot(pm_id: int) -> ResponseReturnValue:
    path = postmortem_view.snapshot_file(_postmortem(pm_id), state().config["hooks.snapshot_dir"])
    if path is None:
        raise NotFound(f"post-mortem {pm_id} kept no snapshot in hooks.snapshot_dir (or it was "
                       f"removed)")
    return send_file(path, mimetype="application/octet-stream", as_attachment=True,
                     download_name=f"postmortem-{pm_id}-snapshot.pickle")


def _analysis_json(view: Callable[..., Any]) -> Response:  # a views.* function
    """``view(store, config, device, host, start, end)`` over the requested window (default:
    six timeline spans ending at the newest sample), as JSON."""
    st = state()
    host = _host()
    device = _known_device(st.store, _device(), host)
    start, end = params.time_window(DEFAULT_SPAN_S * 6, _latest(st.store, device, host))
    return jsonify(view(st.store, st.config, device, host, start, end))


@bp.get("/analysis")
def analysis_report() -> ResponseReturnValue:
    return _analysis_json(views.report)


def _shape() -> dict[str, Any]:
    """The model and serving plan to estimate (defaults: a Llama-3-8B shape, the demo's, 8 x 4k
    context). Without ``params_b`` the parameters are counted from the shape (``gated``: a
    gate/up/down MLP, as Llama's), so changing the shape changes the weights too."""
    shape: dict[str, Any] = {"name": params.text("model", "Llama-3-8B shape", max_len=80),
             "layers": params.integer("layers", 32, low=1, high=1000),
             "kv_heads": params.integer("kv_heads", 8, low=1, high=1024),
             "head_dim": params.integer("head_dim", 128, low=1, high=4096),
             "hidden": params.integer("hidden", 4096, low=1, high=1_000_000),
             "intermediate": params.integer("intermediate", 14336, low=0, high=10_000_000),
             "vocab": params.integer("vocab", 128256, low=0, high=10_000_000),
             "gated": params.boolean("gated", True),
             "params_b": params.number("params_b", None, low=0.001, high=10_000),
             "dtype": params.text("dtype", "bfloat16", max_len=32),
             "context": params.integer("context", 4096, low=1, high=10_000_000),
             "concurrency": params.integer("concurrency", 8, low=1, high=100_000),
             "margin": params.number("margin", 0.10, low=0, high=0.99)}
    gpu_gib = params.number("gpu_gib", None, low=0.001, high=100_000)
    shape["gpu_memory_bytes"] = int(gpu_gib * 2**30) if gpu_gib else None
    if element_bytes(shape["dtype"]) is None:
        raise BadParameter("dtype", f"unknown dtype {shape['dtype']!r}; known: "
                                    f"{known_dtypes()}")
    return shape


@bp.get("/capacity")
def capacity() -> ResponseReturnValue:
    st = state()
    return jsonify(views.capacity(st.store, params.text("host"), _shape()))


@bp.get("/figures/overview")
def figure_overview() -> ResponseReturnValue:
    st = state()
    return jsonify(figures.overview_figure(
        queries.device_rows(st.store, st.config, st.clock.time_s())))


@bp.get("/figures/processes")
def figure_processes() -> ResponseReturnValue:
    st = state()
    return jsonify(figures.processes_figure(
        queries.device_rows(st.store, st.config, st.clock.time_s())))


@bp.get("/figures/timeline")
def figure_timeline() -> ResponseReturnValue:
    config = state().config
    return jsonify(timeline_figure.build(
        _timeline_doc(), config["alerts.fragmentation_warning_ratio"],
        config["sampling.kv_interval_s"]))


@bp.get("/figures/leaks")
def figure_leaks() -> ResponseReturnValue:
    return _analysis_json(verdict_views.leaks_view)


@bp.get("/figures/risk")
def figure_risk() -> ResponseReturnValue:
    return _analysis_json(verdict_views.risk_view)


@bp.get("/config-check")
def config_check() -> ResponseReturnValue:
    """The ``[server]`` section's worst admissible request against the device's limit, as the
    agent's engine checked it (its stored answer)."""
    st = state()
    host = _host()
    device = _known_device(st.store, _device(), host)
    return jsonify({"device": device, "check": views.config_check_view(
        st.store, device, host, st.clock.time_s())})


@bp.get("/figures/capacity")
def figure_capacity() -> ResponseReturnValue:
    st = state()
    doc = views.capacity(st.store, params.text("host"), _shape())
    return jsonify({"figure": figures.capacity_figure(doc), "capacity": doc})


@bp.get("/figures/postmortems/<int:pm_id>")
def figure_postmortem(pm_id: int) -> ResponseReturnValue:
    pm = _postmortem(pm_id)
    return jsonify({"segments": figures.segment_map_figure(pm),
                    "holders": figures.holders_figure(pm)})

