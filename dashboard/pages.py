"""The HTML pages. Each renders a small Jinja shell (autoescaped); ``static/app.js`` fills it
from ``/api/v1`` with ``textContent`` only, and refreshes it by polling.

Pages take the same ``device``, ``host``, ``start`` and ``end`` parameters as the API, checked
the same way, so a bad link gets a 400 page that names the parameter.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from vramscope.dashboard import fleet, params, queries, views
from vramscope.dashboard.state import state
from vramscope.dashboard.verdict import device_verdict, reading_order, stale_after_s
from werkzeug.exceptions import NotFound

bp = Blueprint("pages", __name__)

NAV: tuple[tuple[str, str], ...] = (
    ("pages.overview", "Overview"), ("pages.fleet", "Fleet"),
    ("pages.timeline", "Device timeline"),
    ("pages.leaks", "Leaks"), ("pages.risk", "OOM risk"), ("pages.alerts", "Alerts"),
    ("pages.postmortems", "Post-mortems"), ("pages.capacity", "Capacity"),
)


def _render(template: str, page: str, **context: Any) -> str:
    st = state()
    devices, in_fleet = _picker_devices(st.store, context)
    return render_template(template, page=page, nav=NAV, devices=devices,
                           picker_in_fleet=in_fleet, refresh_s=st.config["dashboard.refresh_s"],
                           host_name=st.store.host_name, **context)


def _picker_devices(store: Any, context: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """The device picker's choices (device pages only) and whether they are a fleet's host's:
    every device; in a fleet (more than ``FLEET_OVERVIEW_DEVICES``, as the Overview counts)
    the shown device's host's, the fleet page one click away for the rest, so a device page
    costs the same whatever the fleet's size (512 options were most of its HTML's time)."""
    if "device" not in context:
        return [], False
    devices = store.devices(host="*")
    if len(devices) <= fleet.FLEET_OVERVIEW_DEVICES:
        return devices, False
    host = context["host"] or store.host_name
    return [d for d in devices if d["host"] == host], True


DEFAULT_TIMELINE_SPAN_S = 3600.0  # the API's default window (api.DEFAULT_SPAN_S)


def _device_context() -> dict[str, Any]:
    """The device, host and window a page was asked for (validated, then passed to the JS),
    with the device's verdict. Without ``device`` in the address the page opens on the most
    severe device, in the Overview's order, not on GPU 0 of the local host."""
    st = state()
    if params.text("device") is None:
        device, host = riskiest_device(st.store)
    else:
        device = params.integer("device", 0, low=0, high=4095)
        host = params.text("host", "") or ""
    end = params.number("end", low=0, high=1e11)
    ctx = {"device": device, "host": host,
           "start": params.number("start", low=0, high=1e11), "end": end,
           "span": params.number("span", low=1, high=params.MAX_SPAN_S)}
    # the verdict line is the device's verdict now: above a window that ends before now it says so
    after_window = end is not None and end < st.clock.time_s()
    return {**ctx, "verdict": {**_verdict(device, host), "after_window": after_window}}


def riskiest_device(store: Any) -> tuple[int, str]:
    """``(device, host)`` of the Overview's first device row (the Overview's
    :func:`~vramscope.dashboard.verdict.reading_order`), from one alert query, without reading
    every device's newest values."""
    active = store.alerts(active_only=True, host="*")
    ranked = []
    for d in store.devices(host="*"):
        if d["device_index"] < 0:
            continue  # a retired label (NVML renumbered the GPUs)
        mine = [a for a in active if a["host"] == d["host"] and a["device"] == d["device_index"]]
        level = device_verdict(mine)["level"]
        ranked.append(reading_order(level, len(mine), d["host"], d["device_index"]))
    if not ranked:
        return 0, ""
    _, _, host, device = min(ranked)
    return device, "" if host == store.host_name else host


def _verdict(device: int, host: str) -> dict[str, Any]:
    """The device's verdict as the Overview shows it: the alert engine's level and rules, and
    each running process's stored leak and OOM-risk verdict."""
    st = state()
    name = queries.host_or_none(st.store, host)
    mine = st.store.alerts(active_only=True, host=name or st.store.host_name, device=device)
    return {**device_verdict(mine),
            "processes": queries.process_verdicts(st.store, device, name, st.clock.time_s())}


def _own_span(ctx: dict[str, Any]) -> dict[str, Any]:
    """A window the address does not give opens on the data's own span when the data ended
    long ago and is shorter than the default hour (an imported 150 s recording fills the
    chart instead of 4 % of it); live data keeps the followed last hour."""
    if any(request.args.get(k) for k in ("start", "end", "span")):
        return ctx
    st = state()
    span = st.store.time_range(ctx["device"], queries.host_or_none(st.store, ctx["host"]))
    if span is None:
        return ctx
    first, last = span
    if last - first >= DEFAULT_TIMELINE_SPAN_S or \
            st.clock.time_s() - last <= stale_after_s(st.config):
        return ctx
    pad = max(1.0, 0.02 * (last - first))  # the first and last samples off the frame's edge
    return {**ctx, "start": first - pad, "end": last + pad}


@bp.get("/")
def overview() -> ResponseReturnValue:
    """A fleet (more than ``FLEET_OVERVIEW_DEVICES`` devices) reads as its hosts, at-risk
    first, instead of a row and two bars per device."""
    grouped = len(state().store.devices(host="*")) > fleet.FLEET_OVERVIEW_DEVICES
    return _render("overview.html", "overview", fleet_mode=grouped)


@bp.get("/fleet", endpoint="fleet")
def fleet_page() -> ResponseReturnValue:
    return _render("fleet.html", "fleet", filter_host=params.text("host") or "",
                   filter_model=params.text("model", max_len=96) or "")


@bp.get("/timeline")
def timeline() -> ResponseReturnValue:
    ctx = _device_context()
    if ctx["start"] is not None and ctx["end"] is not None and ctx["end"] <= ctx["start"]:
        params.time_window(3600.0, None)  # raises the 400 naming "end"
    return _render("timeline.html", "timeline", **_own_span(ctx))


@bp.get("/leaks")
def leaks() -> ResponseReturnValue:
    return _render("leaks.html", "leaks", **_device_context())


@bp.get("/risk")
def risk() -> ResponseReturnValue:
    ctx = _device_context()
    st = state()
    check = views.config_check_view(st.store, ctx["device"],
                                    queries.host_or_none(st.store, ctx["host"]),
                                    st.clock.time_s())
    return _render("risk.html", "risk", config_check=check, **ctx)


@bp.get("/alerts")
def alerts() -> ResponseReturnValue:
    return _render("alerts.html", "alerts")


@bp.get("/postmortems")
def postmortems() -> ResponseReturnValue:
    return _render("postmortems.html", "postmortems")


@bp.get("/postmortems/<int:pm_id>")
def postmortem(pm_id: int) -> ResponseReturnValue:
    if not any(i == pm_id for i, _ in state().store.postmortems(host="*")):
        raise NotFound(f"no post-mortem with id {pm_id}")
    return _render("postmortem.html", "postmortem", pm_id=pm_id)


@bp.get("/capacity")
def capacity() -> ResponseReturnValue:
    return _render("capacity.html", "capacity")


@bp.get("/openapi.json")
def openapi_redirect() -> ResponseReturnValue:
    """Where tools look first; the document lives beside the API it describes."""
    return redirect(url_for("api.openapi_document"), code=308)
