"""Where alerts go: the :class:`AlertSink` seam and its three sinks.

``LogSink`` writes one log line, ``StoreSink`` opens and resolves alert rows in the store,
``WebhookSink`` POSTs the documented JSON body (``vramscope.alert/1``, docs/alerts.md) from its
own delivery thread. ``send`` never blocks the caller (the agent's writer thread) and never
raises: a sink that cannot deliver logs why and counts it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from vramscope.agent.alerts.delivery import DeliveryQueue, Taken
from vramscope.agent.alerts.engine import AlertChange
from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.timefmt import iso_utc

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from vramscope.agent.store import Store

log = logging.getLogger("vramscope.alerts")

DOWN_RETRY_S = 2.0  # while the webhook target is down, at most one try this often
POLL_S = 0.2  # real seconds between looks at changes that wait on the (maybe fake) clock
# Statuses that refuse the body itself: sent again, it would be refused again (a 401, 404 or
# 5xx is the target's state, and may change)
REJECTED_STATUSES = frozenset({400, 413, 422})
SENT, FAILED, REJECTED = "sent", "failed", "rejected"


class AlertSink(Protocol):
    """Takes each fired or resolved alert; ``send`` never blocks and never raises."""

    def send(self, change: AlertChange) -> None: ...

    def close(self) -> None:
        """Deliver what is pending (bounded) and release what the sink holds."""


class LogSink:
    """One log line per change, at most ``burst`` a minute per alert (rule, device, host): a
    flapping rule cannot flood the log; the next line written says how many were left out."""

    def __init__(self, logger: logging.Logger = log, burst: int = 10,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.logger, self.burst, self.clock = logger, burst, clock
        self._windows: dict[tuple[str, int | None, str | None], list[float]] = {}
        self.left_out = 0

    def send(self, change: AlertChange) -> None:
        key = (change.rule, change.device, change.host)
        now = self.clock.monotonic_s()
        window = self._windows.get(key)
        if window is None or now - window[0] >= 60.0:
            window = self._windows[key] = [now, 0.0, window[2] if window else 0.0]
        if window[1] >= self.burst:
            window[2] += 1
            self.left_out += 1
            return
        window[1] += 1
        note = f" ({int(window[2])} changes of this alert left out of the log)" if window[2] else ""
        window[2] = 0.0
        level = logging.WARNING if change.kind == "fired" else logging.INFO
        self.logger.log(level, "alert %s %s [%s] device %s at %s: %s%s", change.kind,
                        change.rule, change.severity, change.device, iso_utc(change.ts_s),
                        change.message, note)

    def close(self) -> None:
        pass


class StoreSink:
    """Opens an alert row when one fires and resolves that row when it resolves."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._open: dict[tuple[str, int, str | None], int] = {}

    def send(self, change: AlertChange) -> None:
        try:
            self.write(change)
        except Exception as exc:  # a sink never raises into ingest
            log.error("could not store alert %s: %s", change.rule, exc)

    def write(self, change: AlertChange, conn: Connection | None = None) -> None:
        """The change as a row (``conn``: in the caller's transaction, as ``vramscope import``
        writes the alerts of what it imports with it); raises what the store raises."""
        key = (change.rule, change.device, change.host)
        if change.kind == "fired":
            self._open[key] = self.store.open_alert(
                change.rule, change.severity, change.ts_s, device=change.device,
                value=change.value, message=change.message, labels=dict(change.labels) or None,
                host=change.host, conn=conn)
        elif key in self._open:
            self.store.resolve_alert(self._open.pop(key), change.ts_s, conn=conn)

    def close(self) -> None:
        pass


def _urllib_post(url: str, body: bytes, timeout_s: float) -> int:
    """POST ``body``; the status code. Redirects are **not** followed: urllib would turn the
    POST into a GET of wherever the target points (an internal URL, over and over); a 3xx is
    returned as the failure it is."""
    import urllib.error
    import urllib.request  # only where a webhook is configured

    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "User-Agent": "vramscope-alerts"})
    try:
        with _opener().open(req, timeout=timeout_s) as resp:
            status: int = resp.status
            return status
    except urllib.error.HTTPError as exc:  # 3xx (not followed), 4xx, 5xx
        exc.close()
        return int(exc.code)


def _opener() -> Any:
    import urllib.request

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # urllib then raises HTTPError with the 3xx code

    return urllib.request.build_opener(_NoRedirect)


class WebhookSink:
    """POSTs each change as JSON from its own thread, the most severe first (``DeliveryQueue``).

    Retries, the one-at-a-time recovery while the target is down, ``REJECTED_STATUSES`` and the
    counts it keeps: docs/alerts.md, "Sinks" and "Delivery". Waits are on the injected clock.
    """

    def __init__(self, url: str, *, timeout_s: float = 5.0, retries: int = 3,
                 backoff_s: float = 0.5, queue_max: int = 1000, max_per_hour: int = 20,
                 clock: Clock = SYSTEM_CLOCK,
                 post: Callable[[str, bytes, float], int] = _urllib_post) -> None:
        self.url, self.timeout_s, self.retries, self.backoff_s = url, timeout_s, retries, backoff_s
        self.clock, self._post = clock, post
        self._queue = DeliveryQueue(queue_max, max_per_hour)
        self._cond = threading.Condition()
        self._closing = False
        self.sent = self.failed = 0
        self._down = False  # the last change failed after all its tries
        self._retry_at = 0.0  # while down: no try before this (monotonic seconds)
        self._full_logged_at: float | None = None
        self._rejected_logged_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="vramscope-webhook", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: Mapping[str, Any], clock: Clock = SYSTEM_CLOCK) -> WebhookSink:
        return cls(config["alerts.webhook_url"], timeout_s=config["alerts.webhook_timeout_s"],
                   retries=config["alerts.webhook_retries"],
                   queue_max=config["alerts.webhook_queue_max"],
                   max_per_hour=config["alerts.webhook_max_per_alert_per_hour"], clock=clock)

    def send(self, change: AlertChange) -> None:
        with self._cond:
            dropped = self._queue.put(change)
            self._cond.notify()
        if dropped:
            self._log_full()

    @property
    def dropped(self) -> int:
        return self._queue.dropped

    @property
    def queued(self) -> int:
        return len(self._queue)

    def counts(self) -> dict[str, int]:
        return {"sent": self.sent, "failed": self.failed, "dropped": self.dropped,
                "coalesced": self._queue.coalesced, "queued": self.queued}

    def _log_full(self) -> None:
        """At most one line a minute: the queue bound is what keeps a dead target from
        holding memory, and the operator must know alerts are being dropped."""
        now = self.clock.monotonic_s()
        if self._full_logged_at is not None and now - self._full_logged_at < 60.0:
            return
        self._full_logged_at = now
        log.error("alert webhook %s is not keeping up: its queue of %d alerts is full, %d "
                  "changes dropped so far, the least severe first (alerts.webhook_url)",
                  self.url, self._queue.max_changes, self.dropped)

    def close(self, timeout_s: float = 10.0) -> None:
        """Try each change not tried yet once more (bounded by ``timeout_s``), then stop the
        thread; changes held by their hourly budget or already failed are not sent."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (taken := self._next()) is not None:
            outcome = self._deliver(taken.change)
            if outcome != SENT and not taken.failed_before:
                self.failed += 1  # each change once, however often it is tried again
            if outcome == REJECTED:
                continue  # the same body would be refused again: not back in line
            with self._cond:
                dropped = self._queue.done(taken, outcome == SENT, self.clock.monotonic_s())
            if dropped:
                self._log_full()

    def _next(self) -> Taken | None:
        """The next change to try; blocks until one is due; None once closing is done."""
        with self._cond:
            while True:
                now = self.clock.monotonic_s()
                if self._closing:
                    return self._queue.take(now, untried_only=True)
                if now >= self._retry_at and (taken := self._queue.take(now)) is not None:
                    return taken
                # a real-time poll while changes wait on the clock (down, or damped): the
                # injected clock may be a fake that tests move
                self._cond.wait(POLL_S if len(self._queue) else None)

    def _deliver(self, change: AlertChange) -> str:
        """SENT, FAILED (the target is down: tried again later) or REJECTED."""
        body = json.dumps(change.to_json(), sort_keys=True).encode("utf-8")
        tries = 1 if self._down else self.retries + 1
        started = self.clock.monotonic_s()
        for attempt in range(tries):
            problem, status = self._try(body)
            if problem is None:
                self.sent += 1
                self._down = False
                return SENT
            if status in REJECTED_STATUSES:
                self._log_rejected(change, problem)
                return REJECTED
            if attempt < tries - 1:
                self.clock.sleep(self.backoff_s * 2 ** attempt)
        if not self._down:  # one line when the target goes down, not one per change
            log.error("alert webhook %s failed after %d tries: %s (alerts.webhook_url); "
                      "until it answers, one change is tried at a time, the most severe first",
                      self.url, tries, problem)
        self._down = True
        self._retry_at = started + DOWN_RETRY_S
        return FAILED

    def _try(self, body: bytes) -> tuple[str | None, int | None]:
        """One POST: (None, status) when delivered, else (what went wrong, status or None)."""
        try:
            status = self._post(self.url, body, self.timeout_s)
        except Exception as exc:
            return str(exc), None
        if status < 300:
            return None, status
        return f"HTTP {status}" + (" (redirects are not followed)" if 300 <= status < 400
                                   else ""), status

    def _log_rejected(self, change: AlertChange, problem: str) -> None:
        """At most one line a minute: a receiver that refuses every body must not flood."""
        now = self.clock.monotonic_s()
        if self._rejected_logged_at is not None and now - self._rejected_logged_at < 60.0:
            return
        self._rejected_logged_at = now
        log.error("alert webhook %s refused the %s change of %s: %s; not tried again "
                  "(alerts.webhook_url)", self.url, change.kind, change.rule, problem)


def sinks_from_config(config: Mapping[str, Any] | None, store: Store | None = None,
                      clock: Clock = SYSTEM_CLOCK) -> list[AlertSink]:
    """Log always; the store when given; the webhook when ``alerts.webhook_url`` is set."""
    sinks: list[AlertSink] = [LogSink()]
    if store is not None:
        sinks.append(StoreSink(store))
    if config is not None and config.get("alerts.webhook_url"):
        sinks.append(WebhookSink.from_config(config, clock))
    return sinks

