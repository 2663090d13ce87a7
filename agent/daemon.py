"""The agent: NVML sampling, the ingest socket, the one writer, retention, its own stats.

Threads (docs/agent.md, "Parts and threads"): ``vramscope-sampler`` (one drift-free loop;
:meth:`Agent.tick` runs whatever is due, so tests drive it with a ``FakeClock``),
``vramscope-ingest`` and ``vramscope-writer``, which also feeds the alert engine after each
committed batch (:class:`AlertFeed`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

from vramscope.agent.alerts.config_check import startup_lines
from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.alerts.sinks import AlertSink, sinks_from_config
from vramscope.agent.analysis.diagnosis import with_cause
from vramscope.agent.clock import SYSTEM_CLOCK, Clock, Schedule
from vramscope.agent.records import Event, PostMortem, Sample
from vramscope.agent.retention import Retention
from vramscope.agent.store import verdicts as store_verdicts
from vramscope.agent.store.store import Store, integrity_wait_s
from vramscope.agent.writer import Writer

if TYPE_CHECKING:
    from prometheus_client.core import Metric
    from vramscope.agent.config import Config
    from vramscope.agent.ingest.peer import ClientInfo
    from vramscope.agent.ingest.server import IngestServer
    from vramscope.agent.sources.nvml import DeviceInfo, DeviceSource, ProcessRow
    from vramscope.agent.sources.prometheus import PrometheusSource

log = logging.getLogger("vramscope.agent")

STATS_INTERVAL_S = 5.0
# A step's fixed part (a statement or two per table) is most of its cost in the steady
# state: every 30 s, not 10, pays it a third as often, while the rows
# passing their day each step (2,400 at 8 x 10 Hz) stay under `retention.step_rows`. The
# minutes not rolled up yet are read from raw samples, so the views do not wait for it.
RETENTION_INTERVAL_S = 30.0
CATCH_UP_POLL_S = 0.05  # while retention catches up: how soon its next step is submitted
# NVML's per-process rows become events with this name and ``data={"used_bytes": N}``: as
# samples their device_used_bytes would mix with the whole-device view ("nvml" samples) in
# every reader that takes a device's samples together (timelines, the risk model).
PROCESS_EVENT = "nvml_process"


@dataclass
class _Rate:
    last_mono_s: float
    last_total: int
    per_s: float = 0.0

    def update(self, now_s: float, total: int) -> float:
        elapsed = now_s - self.last_mono_s
        if elapsed > 0:
            self.per_s = (total - self.last_total) / elapsed
            self.last_mono_s, self.last_total = now_s, total
        return self.per_s


class Agent:
    """The sidecar's parts wired together; also the core of ``EmbeddedAgent``."""

    def __init__(self, config: Config, *, store: Store | None = None, db_url: str | None = None,
                 source: DeviceSource | Literal["nvml"] | None = "nvml",
                 socket_path: str | None = None, listen: bool = True,
                 clock: Clock = SYSTEM_CLOCK, alerts: bool = True) -> None:
        self.config = config
        self.clock = clock
        self.socket_path = socket_path or config["agent.socket_path"]
        if listen:  # the socket's folder first: see _prepare_socket_folder
            _prepare_socket_folder(config, self.socket_path)
        self.store = store if store is not None else Store.from_config(config, db_url)
        self.source = _open_source(source, clock)
        self.writer = Writer(self.store, max_records=config["agent.queue_max_records"],
                             batch_rows=config["agent.batch_rows"],
                             batch_interval_s=config["agent.batch_interval_s"],
                             on_batch=self._on_batch, on_postmortem=self._completed)
        self.retention = Retention.from_config(config, clock)
        self.server = self._make_server() if listen else None
        self.prometheus = _open_prometheus(config, self.writer, clock)
        self.alerts = AlertFeed.from_config(config, self.store) if alerts else None
        now = clock.monotonic_s()
        self._device_schedule = Schedule(config["sampling.device_interval_s"], now)
        self._process_schedule = Schedule(config["sampling.process_interval_s"], now)
        self._stats_schedule = Schedule(STATS_INTERVAL_S, now)
        self._retention_schedule = Schedule(RETENTION_INTERVAL_S, now + 1.0)
        every = config["database.integrity_check_interval_s"]
        self._integrity_schedule = Schedule(every, now + min(every, 60.0)) if every else None
        self._integrity_max_cpu_percent = config["database.integrity_check_max_cpu_percent"]
        self.integrity: dict[str, Any] | None = None  # the last check's result
        # the last retention step ran out of a budget (catching up: a store that was stale, or
        # a backlog after downtime); None before the first step
        self.retention_backlog: bool | None = None
        self._rate = _Rate(now, 0)
        self._pg_size_bytes: int | None = None  # PostgreSQL: read by the stats task
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._paused = False

    def _make_server(self) -> IngestServer:
        from vramscope.agent.ingest.budget import WriteBudget
        from vramscope.agent.ingest.names import NameLimits
        from vramscope.agent.ingest.rare_events import RareEventsPerDay
        from vramscope.agent.ingest.server import IngestServer
        from vramscope.agent.ingest.timewindow import TimeWindow
        from vramscope.agent.settings import parse_uids

        return IngestServer(self.socket_path, on_records=self._on_records,
                            on_postmortem=self._on_postmortem, on_hello=self._on_hello,
                            status=self.status, max_message_bytes=self.config[
                                "agent.max_message_bytes"],
                            allowed_uids=parse_uids(self.config["agent.allowed_uids"]),
                            pause=self._ingest_should_pause,
                            handshake_timeout_s=self.config["agent.handshake_timeout_s"],
                            idle_timeout_s=self.config["agent.idle_timeout_s"],
                            time_window=TimeWindow.from_config(self.config, self.clock),
                            name_limits=NameLimits.from_config(self.config, self.clock),
                            budget=WriteBudget.from_config(self.config),
                            rare_events=RareEventsPerDay.from_config(self.config, self.clock),
                            slot_idle_s=self.config["agent.slot_idle_s"], clock=self.clock)

    def _ingest_should_pause(self) -> bool:
        """Back-pressure with hysteresis: pause reading the socket at 90 % of the queue bound,
        resume at 50 %; never while the database is failing (then the queue drops the oldest,
        and ``vramscope status`` must still answer)."""
        depth, bound = self.writer.queue_depth, self.config["agent.queue_max_records"]
        if self.writer.failing:
            self._paused = False
        elif depth >= 0.9 * bound:
            self._paused = True
        elif depth <= 0.5 * bound:
            self._paused = False
        return self._paused

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self.server is not None:
            self.server.bind()  # first: a second agent on the same socket fails before writing
        if self.source is not None:
            # Before the writer and the socket start: a hook's record names its device by UUID,
            # and one written before NVML's devices would be unjoined (a startup race).
            describe = self._describe_devices(self.source.devices())
            try:
                describe(self.store)
            except Exception as exc:  # noqa: BLE001 - the writer retries it as a task
                log.warning("describing the devices at start failed (%r); tried again by the "
                            "writer once it runs",
                            exc)
                self.writer.submit(describe)
        self.writer.start()
        self.writer.submit(_record_boot_id)
        if self.server is not None:
            self.server.start()
        if self.config["agent.metrics_port"]:
            self._metrics_server = start_metrics(self, self.config["agent.metrics_port"],
                                                 self.config["agent.metrics_host"])
        self._thread = threading.Thread(target=self._loop, name="vramscope-sampler", daemon=True)
        self._thread.start()
        if self.prometheus is not None:
            self.prometheus.start()
        log.info("agent started: %d NVML device(s), socket %s, database %s",
                 len(self.source.devices()) if self.source else 0,
                 self.socket_path if self.server else "(off)", self.store.safe_url)
        self._log_config_check()

    def _log_config_check(self) -> None:
        """The ``[server]`` check against NVML's device totals, once at start-up; the
        ``config_oom`` alert follows from the first samples, at each process's own limit."""
        server = self.alerts.engine.server if self.alerts is not None else None
        if server is not None and self.source is not None:
            totals = {d.index: d.total_bytes for d in self.source.devices() if d.total_bytes}
            for fits, line in startup_lines(server, totals):
                (log.info if fits else log.warning)("%s", line)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop sampling and ingest, then flush every queued record (the final flush)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.server is not None:
            self.server.stop()
        if self.prometheus is not None:
            self.prometheus.stop()
        self.writer.submit(self._stats_task(self.clock.time_s()))
        self.writer.stop(timeout_s)
        self.retention.close()  # the writer thread is done with it: another agent may lead
        if self.alerts is not None:
            self.alerts.close()
        if self.source is not None:
            self.source.close()
        if getattr(self, "_metrics_server", None) is not None:
            self._metrics_server.shutdown()
        log.info("agent stopped: %d rows written, %d dropped", self.writer.stats.written_total,
                 self.writer.stats.dropped_total)

    def run_forever(self) -> None:
        """Run until SIGTERM or SIGINT, then stop with a final flush."""
        def _on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s; flushing and stopping", signal.Signals(signum).name)
            self._stop.set()

        previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            while not self._stop.wait(0.5):
                pass
        finally:
            self.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)

    # --- the sampler loop -----------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self.tick()
            wait_s = self._next_due_s() - self.clock.monotonic_s()
            if self.retention_backlog:  # catching up: the writer moves the schedule to now
                wait_s = min(wait_s, CATCH_UP_POLL_S)
            if wait_s > 0:
                self._stop.wait(wait_s)

    def _next_due_s(self) -> float:
        due = [self._stats_schedule.next_s, self._retention_schedule.next_s]
        if self._integrity_schedule is not None:
            due.append(self._integrity_schedule.next_s)
        if self.source is not None:  # no source: no 10 Hz wake-ups for nothing
            due += [self._device_schedule.next_s, self._process_schedule.next_s]
        return min(due)

    def tick(self) -> None:
        """Run every schedule that is due now (the sampler thread calls this; so can tests)."""
        now = self.clock.monotonic_s()
        if self._device_schedule.due(now):
            self.sample_devices()
        if self._process_schedule.due(now):
            self.sample_processes()
        if self._stats_schedule.due(now):
            self.writer.submit(self._stats_task(self.clock.time_s()))
        if self._retention_schedule.due(now):
            self.writer.submit(self._retention_task)
        if self._integrity_schedule is not None and self._integrity_schedule.due(now):
            self.writer.submit(self._integrity_task)  # which may put the next one further off

    def run_once(self) -> None:
        """One of everything, synchronously: sample, write, stats. For tests."""
        self.sample_devices()
        self.sample_processes()
        self.writer.submit(self._stats_task(self.clock.time_s()))
        self.writer.flush()

    def sample_devices(self) -> None:
        if self.source is None:
            return
        try:
            self.writer.put_many(self.source.read())
        except Exception:  # noqa: BLE001 - a vendor failure must not end sampling
            log.exception("device sampling failed; will retry next tick")

    def sample_processes(self) -> None:
        """NVML process rows -> ``nvml_process`` events for the processes that are our clients,
        plus their device list in the processes table."""
        if self.source is None:
            return
        try:
            rows = self.source.read_processes()
        except Exception:  # noqa: BLE001
            log.exception("process sampling failed; will retry next tick")
            return
        clients = self._clients_by_peer_pid()
        self.writer.put_many([Event(r.ts_s, PROCESS_EVENT, r.device, clients[r.pid],
                                    data={"used_bytes": r.used_bytes},
                                    device_uuid=getattr(r, "device_uuid", None))
                              for r in rows if r.pid in clients])
        self._map_process_devices(rows, clients)

    def _clients_by_peer_pid(self) -> dict[int, int]:
        if self.server is None:
            return {}
        return {c.peer_pid: c.pid for c in self.server.clients
                if c.peer_pid is not None and c.pid is not None}  # pid: peer_pid at least

    def _map_process_devices(self, rows: list[ProcessRow], clients: dict[int, int]) -> None:
        by_pid: dict[int, list[int]] = {}
        for r in rows:
            if r.pid in clients:
                by_pid.setdefault(clients[r.pid], []).append(r.device)
        ts_s = self.clock.time_s()
        for pid, devices in by_pid.items():
            self.writer.submit(_process_devices_task(pid, ts_s, tuple(devices)))

    # --- callbacks from ingest (server thread) --------------------------------------------
    def _on_records(self, records: list[Sample | Event], client: ClientInfo) -> None:
        self.writer.put_many(records)

    def _on_postmortem(self, pm: PostMortem, client: ClientInfo) -> None:
        self.writer.put(pm)

    def _on_hello(self, client: ClientInfo) -> None:
        hello = client.hello
        pid = client.pid
        if pid is None or hello is None:  # called after the hello: never None here
            return
        ts_s = self.clock.time_s()
        ns_pid = getattr(client, "ns_pid", None)  # its pid inside its container, if other
        self.writer.submit(lambda st: st.upsert_process(
            pid, ts_s, name=hello.process, model=hello.model, device_indexes=hello.devices,
            ns_pid=ns_pid))

    # --- state ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The agent's counters (the ``status`` message and ``vramscope status``)."""
        ingest = self.server.stats if self.server is not None else None
        w = self.writer.stats
        clients = self.server.clients if self.server is not None else []
        return {
            "pid": os.getpid(),
            "devices": [d._asdict() for d in self.source.devices()] if self.source else [],
            "clients": [{"pid": c.pid, "process": c.hello.process if c.hello else None,
                         "devices": list(c.hello.devices) if c.hello else []} for c in clients],
            "rows_per_s": round(self._rate.per_s, 3),
            "written_total": w.written_total,
            "queue_depth": self.writer.queue_depth,
            "at_risk_records": self.writer.queue_depth,  # what a SIGKILL now would lose
            "dropped_total": w.dropped_total,
            "client_dropped_total": ingest.client_dropped_total if ingest else 0,
            "rejected_total": ingest.rejected_total if ingest else 0,
            # records whose device UUID named no device of this host: not stored (store.py)
            "unjoined_total": getattr(self.store, "unjoined_total", 0),
            "rejected": dict(ingest.rejected) if ingest else {},
            # live names against their bounds, and the records refused by kind and bound
            "names": self.server.names.status() if self.server is not None else None,
            "records_received_total": ingest.records_total if ingest else 0,
            # quiet clients' heartbeats, and those too soon after another message to count
            "heartbeats": ({"total": ingest.heartbeats_total, "early": ingest.heartbeats_early}
                           if ingest else None),
            "accept_errors": ingest.accept_errors if ingest else 0,
            "loop_errors": ingest.loop_errors if ingest else 0,
            "log_suppressed": ingest.log_suppressed if ingest else 0,
            "db_refused_total": w.refused_total,
            "db_failing": self.writer.failing,
            "db_integrity": self.integrity,
            "retention_backlog": self.retention_backlog,
            # a fleet on one PostgreSQL: whether this agent does the store-wide work (always on
            # SQLite; None before the first retention step)
            "retention_leader": self.retention.leading,
            "retention_catch_up": self.retention.progress(),
            "alerts": self.alerts.counts() if self.alerts is not None else None,
            "prometheus": self.prometheus.counts() if self.prometheus is not None else None,
            "database": self.store.safe_url,
            "db_size_bytes": self._db_size_bytes(),
        }

    def _db_size_bytes(self) -> int | None:
        """SQLite: its files' size now (a stat). PostgreSQL: what the writer thread read last;
        a query here, on the ingest thread, made ``status`` time out while the server was
        away (tests/agent/test_robustness_pg_outage.py)."""
        if self.store.dialect != "postgresql":
            return self.store.size_bytes()
        return self._pg_size_bytes

    def _stats_task(self, ts_s: float) -> Callable[[Store], None]:
        def task(store: Store) -> None:
            self._rate.update(self.clock.monotonic_s(), self.writer.stats.written_total)
            if store.dialect == "postgresql":
                self._pg_size_bytes = store.size_bytes()
            s = self.status()
            catch_up = s["retention_catch_up"] or {}
            # a scrape target that answers is a server the agent hears from, as a socket
            # client is: one client each (the Overview's Sampling health)
            scraped = (s["prometheus"] or {}).get("targets_answering", 0)
            store.write_agent_stats(ts_s, clients=len(s["clients"]) + scraped,
                                    rows_per_s=s["rows_per_s"],
                                    queue_depth=s["queue_depth"],
                                    dropped_total=s["dropped_total"] + s["client_dropped_total"],
                                    rejected_total=s["rejected_total"],
                                    db_size_bytes=s["db_size_bytes"],
                                    retention_behind_s=catch_up.get("behind_s"),
                                    retention_eta_s=catch_up.get("eta_s"),
                                    rejected_by_reason=s["rejected"])
            # a connected client is alive even when it sends nothing (an idle vLLM server):
            # its process row's last_seen_s moves with each report, so the dashboard tells an
            # idle server from one that ended (dashboard/verdict.py)
            for c in s["clients"]:
                if c["process"] is not None and c["pid"] is not None:
                    store.upsert_process(c["pid"], ts_s)
        return task

    def _integrity_task(self, store: Store) -> None:
        """SQLite's quick_check on the writer thread (a reader: WAL lets it run beside the
        writes of others); one log line when the verdict changes, not one per check."""
        problem, cpu_s = store.timed_integrity_check()
        checks = self._integrity_schedule
        assert checks is not None  # only its schedule submits this task
        wait_s = integrity_wait_s(checks.interval_s, cpu_s, self._integrity_max_cpu_percent)
        # a check of a big file is spaced out from when it ended (a sampler thread's float
        # store; it advanced the schedule by one interval when it submitted this task)
        checks.next_s = max(checks.next_s, self.clock.monotonic_s() + wait_s)
        was_ok = self.integrity is None or self.integrity["ok"]
        self.integrity = {"ok": problem is None, "problem": problem,
                          "checked_ts_s": self.clock.time_s(), "cpu_s": cpu_s,
                          "next_in_s": wait_s}
        if problem is not None and was_ok:
            log.error("database integrity check failed: %s. Stop the agent, check the file "
                      "with `sqlite3 FILE 'PRAGMA integrity_check'` and restore or move it "
                      "aside", problem)
        elif problem is None and not was_ok:
            log.warning("database integrity check passes again")

    def _retention_task(self, store: Store) -> None:
        result = self.retention.step(store)
        self.retention_backlog = result.backlog
        if result.busy:
            log.debug("retention step: %s", result)
        if result.backlog:
            # a budget ran out (catching up): again at once while ingest keeps up (less than a
            # batch waiting: the writer commits it between two steps), else in a second; the
            # steady state's few rows wait for the next interval. At one step a second, a
            # day of 8 devices at 10 Hz never rolled up would keep the agent behind for long
            behind = self.writer.queue_depth >= self.config["agent.batch_rows"]
            self._retention_schedule.next_s = self.clock.monotonic_s() + (1.0 if behind
                                                                          else 0.0)

    def _describe_devices(self, infos: list[DeviceInfo]) -> Callable[[Store], None]:
        def task(store: Store) -> None:
            for d in infos:
                store.describe_device(d.index, uuid=d.uuid, name=d.name,
                                      total_bytes=d.total_bytes,
                                      parent_uuid=getattr(d, "parent_uuid", None),
                                      physical_index=getattr(d, "physical_index", None))
        return task

    def _completed(self, pm: PostMortem) -> PostMortem:
        return self.alerts.completed(pm) if self.alerts is not None else pm

    def _on_batch(self, samples: list[Sample], events: list[Event]) -> None:
        # late samples and events: their minutes are rolled up and counted again
        self.retention.note_written(samples, events)
        if self.alerts is not None:
            self.alerts(samples, events)


def read_boot_id(path: str = "/proc/sys/kernel/random/boot_id") -> str | None:
    """This boot's id (Linux): with the host name, it tells a reboot apart in a fleet database."""
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _process_devices_task(pid: int, ts_s: float,
                          devices: tuple[int, ...]) -> Callable[[Store], None]:
    return lambda store: store.upsert_process(pid, ts_s, device_indexes=devices)


def _record_boot_id(store: Store) -> None:
    boot_id = read_boot_id()
    if boot_id is not None:
        store.set_boot_id(boot_id)


def _rejected_by_reason(rejected: dict[str, int]) -> Metric:
    """One series per reason (names, budget_rows, chatter...): which limit is being hit."""
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily("vramscope_agent_rejected_by_reason", "ingest messages and "
                                 "records rejected, by reason", labels=["reason"])
    for reason, count in sorted(rejected.items()):
        family.add_metric([reason], count)
    return family


def start_metrics(agent: Agent, port: int, host: str = "127.0.0.1") -> Any:
    # Any: prometheus_client's WSGIServer, which its stubs do not export.
    """The agent's own counters as Prometheus metrics on ``host:port`` (``/metrics``)."""
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Collector:
        def collect(self) -> Iterator[Metric]:
            s = agent.status()
            yield GaugeMetricFamily("vramscope_agent_clients", "connected hook clients",
                                    value=len(s["clients"]))
            yield GaugeMetricFamily("vramscope_agent_queue_depth", "records waiting in the "
                                    "writer queue", value=s["queue_depth"])
            yield GaugeMetricFamily("vramscope_agent_rows_per_second", "rows committed per "
                                    "second (last stats interval)", value=s["rows_per_s"])
            for name, help_, value in (
                    ("written", "rows committed", s["written_total"]),
                    ("dropped", "records the agent dropped (queue full)", s["dropped_total"]),
                    ("client_dropped", "records clients reported dropped",
                     s["client_dropped_total"]),
                    ("rejected", "ingest messages rejected", s["rejected_total"]),
                    ("unjoined", "records whose device UUID names no device the agent's "
                     "NVML shows (not stored)", s["unjoined_total"])):
                yield CounterMetricFamily(f"vramscope_agent_{name}", help_, value=value)
            yield _rejected_by_reason(s["rejected"])
            hook = (s.get("alerts") or {}).get("webhook")
            if hook is not None:
                for key in ("sent", "failed", "dropped", "coalesced"):
                    yield CounterMetricFamily(f"vramscope_agent_webhook_{key}",
                                              f"alert changes the webhook {key}",
                                              value=hook[key])
                yield GaugeMetricFamily("vramscope_agent_webhook_queued", "alert changes "
                                        "waiting for the webhook", value=hook["queued"])

    registry = CollectorRegistry()
    registry.register(_Collector())
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        from vramscope.agent.errors import VramscopeError

        raise VramscopeError(f"cannot serve metrics on {host}:{port}: {exc.strerror}; "
                             f"choose another agent.metrics_port (0 disables) or "
                             f"agent.metrics_host") from None
    return server


def _prepare_socket_folder(config: Config, socket_path: str) -> None:
    """Create the socket's private (0700) folder before the database is opened: a SQLite file
    beside the socket (docs/vllm.md's ``/tmp/vramscope/vs.db`` and ``agent.sock``) would
    otherwise create the folder with the umask's 755, which the socket then refuses."""
    from vramscope.agent.ingest.socket_dir import prepare_socket_folder
    from vramscope.agent.settings import parse_uids

    prepare_socket_folder(socket_path, parse_uids(config["agent.allowed_uids"]))


def _open_source(source: DeviceSource | Literal["nvml"] | None,
                 clock: Clock) -> DeviceSource | None:
    """``"nvml"`` opens the real NVML (or None, with one log line); None means no sampling;
    anything else is a ``DeviceSource`` (a fake)."""
    if source == "nvml":
        from vramscope.agent.sources.nvml import open_nvml

        return open_nvml(clock)
    return source


def _open_prometheus(config: Config, writer: Writer, clock: Clock) -> PrometheusSource | None:
    """The ``[sources.prometheus]`` scraper (its own thread: a slow server must not stall NVML
    sampling), or None when it names no target."""
    from vramscope.agent.sources.prometheus import PrometheusSource

    def note_process(pid: int, ts_s: float, name: str, model: str | None, device: int) -> None:
        writer.submit(lambda st: st.upsert_process(pid, ts_s, name=name, model=model,
                                                   device_indexes=(device,)))

    return PrometheusSource.from_config(config, writer.put_many, clock, note_process)


class AlertFeed:
    """Live alerting: each committed batch through the engine, each change to every sink.

    Runs on the writer thread after a commit. A bad rule fails at construction (the agent does
    not start with a config it cannot honour: ``vramscope config check`` names the rule); a sink
    that raises is logged and the others still get the change.
    """

    def __init__(self, engine: AlertEngine, sinks: list[AlertSink],
                 store: Store | None = None) -> None:
        self.engine = engine
        self.sinks = sinks
        # the engine's verdicts go to the store (one answer for every page and command); a
        # live agent keeps none in memory
        self.store = store
        engine.verdicts.keep = False
        self._delivered: dict[tuple[str, int | None, str | None], str] = {}  # key -> kind
        self.coalesced = 0  # changes not delivered: undone within the same batch

    @classmethod
    def from_config(cls, config: Config, store: Store) -> AlertFeed:
        return cls(AlertEngine.from_config(config), sinks_from_config(config, store), store)

    def __call__(self, samples: list[Sample], events: list[Event]) -> None:
        changes = self.engine.feed_batch(samples, events)  # no copy, no re-split
        rows = self.engine.verdicts.take()
        if rows and self.store is not None:
            try:
                store_verdicts.write(self.store, rows)
            except Exception:  # noqa: BLE001 - the alerts below still go out
                log.exception("storing %d verdicts failed", len(rows))
        for change in self._net(changes):
            for sink in self.sinks:
                try:
                    sink.send(change)
                except Exception:  # noqa: BLE001 - one broken sink must not stop the others
                    log.exception("alert sink %r failed", sink)

    def completed(self, pm: PostMortem) -> PostMortem:
        """The post-mortem with the engine's cause where its producer gave none: growth when
        its process's leak verdict holds a leak, else the cause of the risk episode the OOM
        ended (one cause on the alert, the verdict and the post-mortem)."""
        d = self.engine.devices.get(pm.device)
        if d is None:
            return pm
        leak = d.leaks.get(pm.pid)
        if leak is not None and leak.result.detected and leak.result.slope_bytes_per_s > 0:
            return with_cause(pm, "growth")
        model = d.risks.get(pm.pid)
        ep = d.episodes.get(model) if model is not None else None
        return with_cause(pm, None if ep is None else ep.cause or ep.ended_cause)

    def _net(self, changes: list[Any]) -> list[Any]:
        """Per alert, only its last change in the batch, and only when it differs from what
        the sinks have. A rule that fires and resolves on every sample would otherwise cost a
        log line and two store transactions per sample on the writer thread, and starve ingest;
        now it costs at most one change per alert per batch. The rest is counted."""
        last: dict[tuple[str, int | None, str | None], Any] = {}
        for change in changes:
            last[(change.rule, change.device, change.host)] = change
        out = [c for key, c in last.items() if self._delivered.get(key, "resolved") != c.kind]
        for c in out:
            self._delivered[(c.rule, c.device, c.host)] = c.kind
        self.coalesced += len(changes) - len(out)
        return out

    def counts(self) -> dict[str, Any]:
        """For ``status`` and /metrics: changes coalesced away, and the webhook's counts."""
        hooks = [s.counts() for s in self.sinks if hasattr(s, "counts")]
        return {"coalesced": self.coalesced, "webhook": hooks[0] if hooks else None}

    def close(self) -> None:
        """Let every sink deliver what it holds (after the final flush fed the last batch)."""
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:  # noqa: BLE001 - stopping goes on
                log.exception("alert sink %r failed to close", sink)
