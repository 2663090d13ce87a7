"""``vramscope bench dashboard``: every page and API route on a store that starts old.

The store comes from :mod:`tools.history_generator`, as the default tiers
leave it: 8 devices at 10 Hz for 7 days, raw samples for the last day (6.9 M) and the
per-second and per-minute tiers for the week (about 3.5 minutes to build) — unless
``options.quick`` (2 devices, one sample per 5 s, 7 days: seconds to build). ``--db URL``
benchmarks the database at URL instead, as it is when it already holds samples (so a
generated week can be built once and reused), or generated there when it is empty.

Figures, each the median of ``rounds`` alternating calls through the Flask app (query,
shaping and JSON: the server's whole time):

- every windowed route (timeline, its figure, leaks, risk, analysis) at 15 min, 1 h, 6 h, 24 h,
  3 days and 7 days ending at the newest sample, and at 15 min and 1 h three days back (only
  the per-second tier holds them), held to 300 ms, and the routes that read the stored verdicts
  (leaks, risk, analysis) to 100 ms;
- every windowless route (overview, fleet, devices, hosts, freshness, processes, capacity,
  metrics) once, and the HTML pages as one figure (the slowest), held to 300 ms; the overview
  and the fleet also as a ratio against the same route
  on a store of the same devices holding only the last hour of the same history (target:
  within 2x: age must not cost), and, for reference, against an empty store (no devices: a
  lower bound, not a target);
- the fleet routes (``/metrics``, the fleet page and its API, the Overview) on a fleet of
  64 hosts x 8 GPUs (an hour of the same history each, one sample per 5 s, with its events
  and stored verdicts), on the same backend, held to the fleet's 1 s;
- the 24 h timeline against its baseline, the same range fetched raw and serialised;
- the database's bytes per device-day, and each tier's (raw samples, events, the per-second
  tier, minute rollups, their ten-minute groups, the event counts) per device-day of the span
  it covers.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from tools.bench import (
    BenchOptions,
    Figure,
    Timing,
    create_pg_database,
    drop_pg_database,
    interleaved,
    rounds_or,
)
from tools.history_generator import History, generate

if TYPE_CHECKING:
    from flask.testing import FlaskClient
    from vramscope.agent.store import Store

# label -> (how long before the newest sample the window ends, its span): windows ending now
# at each scale the dashboard offers, one across the raw horizon (3 d: raw samples for its
# newest day), and two short ones three days back, which only the per-second tier holds
DAY = 86_400.0
WINDOWS = {"15 min": (0.0, 900.0), "1 h": (0.0, 3600.0), "6 h": (0.0, 6 * 3600.0),
           "24 h": (0.0, DAY), "3 d": (0.0, 3 * DAY), "7 d": (0.0, 7 * DAY),
           "15 min, 3 d ago": (3 * DAY, 900.0), "1 h, 3 d ago": (3 * DAY, 3600.0)}
WINDOWED = ("/api/v1/timeline", "/api/v1/figures/timeline", "/api/v1/figures/leaks",
            "/api/v1/figures/risk", "/api/v1/analysis")
PLAIN = ("/api/v1/overview", "/api/v1/fleet", "/api/v1/devices", "/api/v1/hosts",
         "/api/v1/freshness", "/api/v1/processes", "/api/v1/capacity", "/metrics")
# the HTML pages (a few milliseconds each): one figure together, the slowest, each page's
# median in its spread
PAGES = ("/", "/timeline", "/leaks", "/risk", "/capacity", "/alerts", "/fleet")
# the routes also held to "age must not cost" against a store holding the last hour only
AGE_RATIO_ROUTES = ("/api/v1/overview", "/api/v1/fleet")
TARGET_MS = 300.0
# the routes that answer from the stored verdicts (issue 31): no detection runs on a page
VERDICT_ROUTES = ("/api/v1/figures/leaks", "/api/v1/figures/risk", "/api/v1/analysis")
VERDICT_TARGET_MS = 100.0
DEVICE = 1
# A fleet (issue 48): 64 nodes of 8 GPUs, each route that reads all of it within a second
FLEET_HOSTS, FLEET_DEVICES = 64, 8
FLEET_ROUTES = ("/metrics", "/api/v1/fleet", "/fleet", "/api/v1/overview")
FLEET_TARGET_MS = 1000.0


def run(options: BenchOptions) -> list[Figure]:
    from vramscope.agent.store import Store

    # raw samples compacted as retention's default compact_after_s leaves them
    history = (History(devices=2, hz=0.2, days=7, compact_after_s=600.0) if options.quick
               else History(devices=8, hz=10.0, days=7, compact_after_s=600.0))
    rounds = rounds_or(options, 1 if options.quick else 3)
    with tempfile.TemporaryDirectory(prefix="vramscope-bench-") as workdir:
        url = options.db_url or f"sqlite:///{os.path.join(workdir, 'dashboard.db')}"
        store = Store.open(url, host_name="bench-host")
        empty = Store.open(f"sqlite:///{os.path.join(workdir, 'empty.db')}",
                           host_name="bench-host")
        try:
            if store.count("samples") == 0:
                generate(store, history)
            return _measure(store, empty, history, rounds, workdir)
        finally:
            store.close()
            empty.close()


def _measure(store: Store, empty: Store, history: History, rounds: int,
             workdir: str) -> list[Figure]:
    from vramscope.agent.clock import FakeClock
    from vramscope.dashboard.app import create_app

    clock = FakeClock(history.end_s + 1.0)  # the newest sample is a second old: "live"
    client = create_app(None, store, clock=clock).test_client()
    figures = _windowed(client, history, rounds) + _plain(client, rounds)
    young = _young_store(store, history, workdir)
    try:
        young_client = create_app(None, young, clock=clock).test_client()
        figures += [_age_ratio(client, young_client, rounds, "an hour of the same "
                               f"history ({young.dialect})", target=True, route=route)
                    for route in AGE_RATIO_ROUTES]
    finally:
        young.close()
        if young.dialect == "postgresql":
            drop_pg_database(young.engine.url.render_as_string(hide_password=False))
    figures += _fleet(store, history, rounds, workdir)
    empty_client = create_app(None, empty, clock=clock).test_client()
    figures.append(_age_ratio(client, empty_client, rounds, f"an empty {empty.dialect} "
                              "store", target=False))
    figures += _timeline_vs_raw(client, store, history, rounds)
    figures += _bytes_per_device_day(store, history)
    return figures


def _get(client: FlaskClient, url: str) -> Callable[[], int]:
    def call() -> int:
        response = client.get(url)
        if response.status_code >= 500:
            raise RuntimeError(f"{url}: HTTP {response.status_code}")
        status: int = response.status_code
        return status
    return call


def _route_figure(metric: str, timing: Timing, status: int,
                  target_ms: float = TARGET_MS) -> Figure:
    ms = timing.median_s * 1000
    return Figure("dashboard", metric, ms, "ms",
                  spread=timing.spread(1000, "ms") + f"; HTTP {status}",
                  target=f"<= {target_ms:g}", met=ms <= target_ms)


def _windowed(client: FlaskClient, history: History, rounds: int) -> list[Figure]:
    out = []
    for route in WINDOWED:
        for label, (back, span) in WINDOWS.items():
            end = history.end_s - back
            url = f"{route}?device={DEVICE}&start={end - span!r}&end={end!r}"
            call = _get(client, url)
            status = call()  # warm: the first call of a route pays for imports
            [timing] = interleaved([call], rounds)
            target = VERDICT_TARGET_MS if route in VERDICT_ROUTES else TARGET_MS
            out.append(_route_figure(f"{route} {label}", timing, status, target))
    return out


def _plain(client: FlaskClient, rounds: int) -> list[Figure]:
    return ([_route_once(client, route, rounds, route, TARGET_MS) for route in PLAIN]
            + [_pages(client, rounds)])


def _pages(client: FlaskClient, rounds: int) -> Figure:
    """The HTML pages (:data:`PAGES`) timed as :func:`_route_once` times a route: the slowest
    page's median, held to ``TARGET_MS``."""
    medians = {}
    for page in PAGES:
        call = _get(client, page)
        call()
        [timing] = interleaved([call], rounds)
        medians[page] = timing.median_s * 1000
    slowest = max(medians, key=medians.__getitem__)
    each = ", ".join(f"{page} {ms:.3g}" for page, ms in medians.items())
    return Figure("dashboard", "HTML pages, the slowest", medians[slowest], "ms",
                  spread=f"{slowest}; medians (ms) of {rounds} rounds: {each}",
                  target=f"<= {TARGET_MS:g}", met=medians[slowest] <= TARGET_MS)


def _route_once(client: FlaskClient, route: str, rounds: int, metric: str,
                target_ms: float) -> Figure:
    """``route`` timed over ``rounds`` after one warm call (its first pays for imports)."""
    call = _get(client, route)
    status = call()
    [timing] = interleaved([call], rounds)
    return _route_figure(metric, timing, status, target_ms)


def _young_store(store: Store, history: History, workdir: str) -> Store:
    """The store's devices with only the last hour of the same history: what the overview
    costs when the store is young (an empty store has no devices to show). On the old
    store's backend (PostgreSQL: a new database on the same server), so that the ratio is
    the cost of age alone: against a young SQLite file a PostgreSQL store's overview also
    paid its round trips (about 40 queries): 2.7x on the 8-device week."""
    from vramscope.agent.store import Store

    devices = len(store.devices()) or history.devices
    url = f"sqlite:///{os.path.join(workdir, 'young.db')}"
    if store.dialect == "postgresql":
        server, name = store.engine.url.render_as_string(hide_password=False).rsplit("/", 1)
        url = create_pg_database(server, f"{name}_young"[:63])
    young = Store.open(url, host_name="bench-host")
    if young.count("samples") == 0:
        generate(young, History(devices=devices, hz=_rate_hz(store, history), days=1 / 24,
                                end_s=history.end_s))
    return young


def _fleet(store: Store, history: History, rounds: int, workdir: str) -> list[Figure]:
    """The routes that read every device, on a fleet of ``FLEET_HOSTS`` x ``FLEET_DEVICES``
    ending where ``history`` does, on the measured store's backend (PostgreSQL: a scratch
    database on the same server, dropped after): the fleet's size, not its age, is what
    they must bear. Raw rows only (no tiers: these routes read each device's newest)."""
    from vramscope.agent.clock import FakeClock
    from vramscope.agent.store import Store
    from vramscope.dashboard.app import create_app

    url = f"sqlite:///{os.path.join(workdir, 'fleet.db')}"
    if store.dialect == "postgresql":
        server, name = store.engine.url.render_as_string(hide_password=False).rsplit("/", 1)
        url = create_pg_database(server, f"{name}_fleet"[:63])
    fleet = Store.open(url, host_name="node-00")
    try:
        for i in range(FLEET_HOSTS if fleet.count("samples") == 0 else 0):
            host = Store.open(url, host_name=f"node-{i:02d}")  # one at a time: one connection
            try:
                generate(host, History(devices=FLEET_DEVICES, hz=0.2, days=1 / 24,
                                       end_s=history.end_s, rollups=False))
            finally:
                host.close()
        client = create_app(None, fleet, clock=FakeClock(history.end_s + 1.0)).test_client()
        return [_route_once(client, route, rounds,
                            f"{route}, {FLEET_HOSTS} hosts x {FLEET_DEVICES} GPUs",
                            FLEET_TARGET_MS) for route in FLEET_ROUTES]
    finally:
        fleet.close()
        if store.dialect == "postgresql":
            drop_pg_database(url)


def _rate_hz(store: Store, history: History) -> float:
    """The old store's sampling rate over its newest minute (a ``--db`` store need not be the
    default history's): the young store must show the overview as many samples."""
    from vramscope.agent.store.reader import Span, count_samples

    span = store.time_range()
    if span is None:
        return history.hz
    device = store.devices()[0]["device_index"]
    n = count_samples(store, Span(device, span[1] - 60.0, span[1]), 100_000)
    return max(float(f"{n / 60.0:.2g}"), 1 / 60)


def _age_ratio(client: FlaskClient, other: FlaskClient, rounds: int, what: str,
               target: bool, route: str = "/api/v1/overview") -> Figure:
    """``route`` on the old store against ``other`` (the same route, same run)."""
    old, new = _get(client, route), _get(other, route)
    old(), new()
    aged, fresh = interleaved([old, new], rounds)
    ratio = aged.median_s / fresh.median_s
    label = "1 h store" if target else "empty store"
    return Figure("dashboard", f"{route}, old store / {label}", ratio, "x",
                  spread=f"old {aged.spread(1000, 'ms')}; {label} {fresh.spread(1000, 'ms')}",
                  baseline=f"the same route on {what}, same run",
                  target="<= 2" if target else "", met=ratio <= 2 if target else None)


def _timeline_vs_raw(client: FlaskClient, store: Store, history: History,
                     rounds: int) -> list[Figure]:
    from vramscope.agent.trace import sample_to_json

    start, end = history.end_s - 86_400, history.end_s
    url = f"/api/v1/timeline?device={DEVICE}&start={start!r}&end={end!r}&max_points=2000"

    def raw() -> int:
        rows = store.samples(DEVICE, start, end)
        return len(json.dumps([sample_to_json(s) for s in rows]))
    sub, base = interleaved([_get(client, url), raw], rounds)
    ratio = base.median_s / sub.median_s
    return [Figure("dashboard", "raw 24 h fetch + JSON / downsampled timeline", ratio, "x",
                   spread=f"raw {base.spread(1000, 'ms')}",
                   baseline="Store.samples + json.dumps of the same range, same run",
                   target=">= 10", met=ratio >= 10)]


RAW_EDGES = (("ts_s", "samples"), ("first_s", "sample_blocks"), ("last_s", "sample_blocks"))


def _bytes_per_device_day(store: Store, history: History) -> list[Figure]:
    """From the store itself (a reused ``--db`` store need not have the default shape): the
    whole database per device-day of history, and what each tier costs per device-day of the
    span it covers (raw samples their newest day, the tiers the whole week)."""
    size = store.size_bytes() or 0
    devices = max(len(store.devices()), 1)
    lo, hi = store.time_range() or (0.0, DAY)
    days = max(hi - lo, 1.0) / DAY
    tiers = _tier_bytes(store)
    with store.engine.connect() as c:  # raw samples: rows of samples and of the blocks
        rows = sum(c.exec_driver_sql(sql).scalar() or 0 for sql in (
            "SELECT count(*) FROM samples", "SELECT sum(count) FROM sample_blocks"))
        raw_lo = min((x for x in (c.exec_driver_sql(f"SELECT min({col}) FROM {t}").scalar()
                                  for col, t in RAW_EDGES) if x is not None), default=None)
        raw_hi = max((x for x in (c.exec_driver_sql(f"SELECT max({col}) FROM {t}").scalar()
                                  for col, t in RAW_EDGES) if x is not None), default=None)
    raw_days = max((raw_hi or 0.0) - (raw_lo or 0.0), 1.0) / DAY
    per = size / (devices * days) / 2**20
    out = [Figure("dashboard", "database MiB per device-day (all tiers)", per, "MiB",
                  spread=f"{size} bytes, {devices} devices x {days:.2f} days; {rows} raw "
                         f"samples over the newest {raw_days:.2f} days "
                         f"({rows / (devices * raw_days * DAY):.3g} Hz); {store.dialect}",
                  target="<= 25", met=per <= 25)]
    covers = {"raw samples and their indexes": raw_days, "events": raw_days,
              "per-second tier": days, "minute rollups": days, "ten-minute groups": days,
              "event counts per minute": days}
    for tier, nbytes in tiers.items():
        out.append(Figure("dashboard", f"MiB per device-day: {tier}",
                          nbytes / (devices * covers[tier]) / 2**20, "MiB",
                          spread=f"{nbytes} bytes over {covers[tier]:.2f} days of "
                                 f"{devices} devices; {store.dialect}"))
    return out


# tier -> the tables whose pages (and their indexes') it is
_TIER_TABLES = {"raw samples and their indexes": ("samples", "sample_blocks"),
                "events": ("events", "event_blocks"),
                "per-second tier": ("seconds",), "minute rollups": ("rollups",),
                "ten-minute groups": ("rollups_10m",), "event counts per minute": ("event_counts",)}


def _tier_bytes(store: Store) -> dict[str, int]:
    """Bytes of each tier's tables with their indexes: SQLite's ``dbstat`` pages by table
    (``sqlite_schema.tbl_name`` maps an index to its table), PostgreSQL's
    ``pg_total_relation_size`` over each table's partitions."""
    with store.engine.connect() as c:
        if store.dialect == "sqlite":
            got = dict(c.exec_driver_sql(
                "SELECT m.tbl_name, sum(d.pgsize) FROM dbstat d JOIN sqlite_schema m "
                "ON m.name = d.name GROUP BY m.tbl_name").all())
        else:
            # a table's own size, and its partitions' (pg_partition_tree lists nothing for a
            # table that is not partitioned, and a partitioned parent holds no rows itself)
            got = {t: c.exec_driver_sql(
                f"SELECT pg_total_relation_size('{t}') + coalesce((SELECT "
                f"sum(pg_total_relation_size(relid)) FROM pg_partition_tree('{t}') "
                f"WHERE relid <> '{t}'::regclass), 0)").scalar()
                for names in _TIER_TABLES.values() for t in names}
    return {tier: int(sum(got.get(t) or 0 for t in names))
            for tier, names in _TIER_TABLES.items()}
