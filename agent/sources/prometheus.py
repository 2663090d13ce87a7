"""Prometheus source: the KV and request view of an inference server vramscope does not enter.

Every ``interval_s`` each ``[sources.prometheus]`` target's ``/metrics`` is fetched and mapped to
the records the in-server hooks make (docs/vllm.md, "Metrics beside any server"). Each target is
scraped on its own thread against its own deadline, so a slow server stalls nothing else; a
failing one gives no records and one log line until it answers again. The page's parse and
bounds: ``prometheus_page.py``; one target's state and records: ``prometheus_target.py``. This
module fetches and schedules.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.ingest.timewindow import TimeWindow
from vramscope.agent.records import Event, Sample
from vramscope.agent.settings import split_targets
from vramscope.agent.sources import listener
from vramscope.agent.sources.prometheus_page import PRESETS, check_page, parse_exposition
from vramscope.agent.sources.prometheus_target import TargetState
from vramscope.agent.sources.scrape_bounds import ScrapeBounds, ScrapeRefused

log = logging.getLogger("vramscope.prometheus")

NOTE_EVERY_S = 5.0  # how often its process row is touched (last seen: "connected" on the Overview)
MAX_BODY_BYTES = 8 * 1024 * 1024  # a /metrics page larger than this is refused, not parsed


class PrometheusSource:
    """Scrape ``targets`` every ``interval_s``; records go to ``put`` (the writer's put_many).

    ``run_once()`` scrapes every target once, synchronously (tests); ``start()`` gives each
    target a drift-free loop in its own named daemon thread (one target's timeouts never delay
    another's scrapes). ``fetch`` is the seam (URL -> page text), the real one is ``urllib``;
    ``find_pid`` (port -> pid) the real one ``/proc``. ``note_process`` (pid, ts_s, name, model,
    device) keeps a local target's process row (the agent's writer). ``bounds``: what one
    scrape may say (``scrape_bounds``); a page beyond them is counted in ``refused_total``.
    """

    def __init__(self, targets: Iterable[str], preset: str, put: Callable[[list[Any]], None], *,
                 interval_s: float = 1.0, timeout_s: float = 2.0, device: int = 0,
                 clock: Clock = SYSTEM_CLOCK,
                 fetch: Callable[[str, float], str] | None = None,
                 window: TimeWindow | None = None,
                 find_pid: Callable[[int], int | None] = listener.pid_listening,
                 note_process: Callable[[int, float, str, str | None, int], None] | None = None,
                 bounds: ScrapeBounds | None = None) -> None:
        if preset not in PRESETS:
            raise ValueError(f"unknown Prometheus preset {preset!r}; allowed: "
                             f"{', '.join(PRESETS)}")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.bounds = bounds or ScrapeBounds()
        self.targets = [TargetState(url, PRESETS[preset], self.bounds.max_request_events)
                        for url in targets]
        self.put = put
        self.interval_s, self.timeout_s, self.device = interval_s, timeout_s, device
        self.clock = clock
        self.fetch = fetch or fetch_url
        self.find_pid, self.note_process = find_pid, note_process
        self.scrapes_total = self.failures_total = self.refused_total = 0
        self._counts_lock = threading.Lock()  # the counters are shared by the targets' threads
        # records outside the agent's time window (a clock stepped while scraping): refused as
        # on the socket (agent/ingest/timewindow.py) and counted here
        self.window = window
        self.rejected_ts_total = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @classmethod
    def from_config(cls, config: Mapping[str, Any], put: Callable[[list[Any]], None],
                    clock: Clock = SYSTEM_CLOCK,
                    note_process: Callable[[int, float, str, str | None, int], None] | None
                    = None) -> PrometheusSource | None:
        """The source ``[sources.prometheus]`` asks for, or None when it names no target."""
        targets = split_targets(config["sources.prometheus.targets"])
        if not targets:
            return None
        return cls(targets, config["sources.prometheus.preset"], put,
                   interval_s=config["sources.prometheus.interval_s"],
                   timeout_s=config["sources.prometheus.timeout_s"],
                   device=config["sources.prometheus.device"], clock=clock,
                   window=TimeWindow.from_config(config, clock), note_process=note_process,
                   bounds=ScrapeBounds(config["sources.prometheus.max_requests"],
                                       config["sources.prometheus.max_request_events"]))

    def run_once(self) -> int:
        """Scrape every target once; returns how many records were put."""
        return sum(self.scrape_target(target) for target in self.targets)

    def scrape_target(self, target: TargetState) -> int:
        """Scrape one target and put its records; returns how many."""
        records = self._scrape(target)
        if records:
            self.put(records)
        return len(records)

    def counts(self) -> dict[str, int]:
        """For ``vramscope status``: scrapes, those that failed, those refused (in failures),
        and the targets answering now (each a server the agent hears from: a client)."""
        with self._counts_lock:
            return {"scrapes_total": self.scrapes_total, "failures_total": self.failures_total,
                    "refused_total": self.refused_total,
                    "targets_answering": sum(1 for t in self.targets
                                             if t.answered and not t.failing)}

    def _count(self, name: str, n: int = 1) -> None:
        with self._counts_lock:
            setattr(self, name, getattr(self, name) + n)

    def _scrape(self, target: TargetState) -> list[Sample | Event]:
        self._count("scrapes_total")
        try:
            asked_s = self.clock.time_s()
            page = self.fetch(target.url, self.timeout_s)
            # the scrape's time: the middle of the fetch, during which the server made the
            # page, not after the parse (a busy page takes milliseconds to parse, in which a
            # busy pool moves on): the records say what the server said then
            now_s = (asked_s + self.clock.time_s()) / 2
            samples = parse_exposition(page)
            check_page(samples, target.preset, self.bounds)
            if target.failing:  # back after a gap: maybe a restart on the port, a new pid
                target.resolved_at = None
            target.resolve(now_s, self.find_pid)
            records = target.records(samples, now_s, self.device)
            self.bounds.check_records(len(records))
            self._note(target, now_s)
        except Exception as exc:  # noqa: BLE001 - a bad target must not stop the agent
            self._count("failures_total")
            if isinstance(exc, ScrapeRefused):
                self._count("refused_total")
            if not target.failing:
                target.failing = True
                log.warning("Prometheus target %s: %s; no KV or request records from it until "
                            "it answers (sources.prometheus.targets)", target.url, _why(exc))
            return []
        target.answered = True
        if target.failing:
            target.failing = False
            log.info("Prometheus target %s answers again", target.url)
        if self.window is not None:
            kept, refused = self.window.keep(records)
            if refused is not None:
                self._count("rejected_ts_total", refused.records)
                log.warning("Prometheus target %s: %s", target.url, self.window.describe(refused))
                records = list(kept)
        return records

    def _note(self, target: TargetState, now_s: float) -> None:
        """Keep a local target's process row (named, its model, last seen) every
        ``NOTE_EVERY_S``, and at once when its pid changed."""
        if self.note_process is None or target.pid is None:
            return
        if target.noted_at is None or now_s - target.noted_at >= NOTE_EVERY_S:
            target.noted_at = now_s
            self.note_process(target.pid, now_s, target.process_name, target.model, self.device)

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._loop, args=(target,), daemon=True,
                                          name=f"vramscope-prometheus-{n}")
                         for n, target in enumerate(self.targets)]
        for thread in self._threads:
            thread.start()
        log.info("scraping %d Prometheus target(s) every %g s (preset %s)", len(self.targets),
                 self.interval_s, self.targets[0].preset.name)

    def stop(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + self.timeout_s + 5
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _loop(self, target: TargetState) -> None:
        next_s = time.monotonic()
        while not self._stop.is_set():
            self.scrape_target(target)
            next_s += self.interval_s
            now = time.monotonic()
            if next_s < now:  # late by more than an interval: skip, don't burst
                next_s = now
            self._stop.wait(next_s - now)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A scrape target is the URL configured: a redirect is an error that names where it
    pointed (each hop would cost another timeout, and could lead anywhere)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl} not followed; "
                                     "name the final URL in sources.prometheus.targets",
                                     headers, fp)


_OPENER = urllib.request.build_opener(_NoRedirects())
_CHUNK_BYTES = 65_536


def fetch_url(url: str, timeout_s: float) -> str:
    """GET ``url`` as text within ``timeout_s`` in all (a server trickling its page a byte at
    a time never waits out a per-read timeout); raises on HTTP errors, redirects, timeouts and
    pages over ``MAX_BODY_BYTES``."""
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    chunks: list[bytes] = []
    size = 0
    with _OPENER.open(request, timeout=timeout_s) as response:
        while size <= MAX_BODY_BYTES:
            if time.monotonic() > deadline:
                raise TimeoutError(f"page not complete after {timeout_s:g} s "
                                   "(sources.prometheus.timeout_s)")
            chunk: bytes = response.read1(_CHUNK_BYTES)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    if size > MAX_BODY_BYTES:
        raise ValueError(f"page larger than {MAX_BODY_BYTES} bytes")
    return b"".join(chunks).decode("utf-8", errors="replace")


def _why(exc: Exception) -> str:
    if isinstance(exc, ScrapeRefused):
        return f"page refused: {exc}"
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}" + (f" ({exc.msg})" if 300 <= exc.code < 400 else "")
    if isinstance(exc, urllib.error.URLError):
        return f"cannot connect ({exc.reason})"
    return f"{type(exc).__name__}: {exc}"
