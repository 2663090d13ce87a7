"""Issue 45's hostile scrape page and hung webhook receiver against a real ``vramscope agent``
process, measured: part of ``vramscope bench limits`` (:mod:`tools.bench.limits`;
docs/agent.md "Scrape bounds", docs/alerts.md "Delivery").

Scrape (:func:`scrape`): the agent scrapes a local page ten times a second; first a healthy
one (``running 1``) for ``idle_s``, then the hostile one for ``seconds`` while a good hook
client sends 760 samples spread over the same time. Figures: the agent's RSS (the largest
after the page turned hostile) against its idle size (the largest in the healthy phase),
target within 10 %; the good client's samples written, target 100 %. Run with the issue's
``vllm:num_requests_running 1e9`` (37 s: it took the agent to 1 GiB before the bounds);
``scrape("flap", ...)`` flaps ``running`` 0 <-> 100,000 instead (within the caps: the
bounded-records path).

Webhook (:func:`webhook`): a user rule flapping on 16 devices every 0.5 s for 5 minutes
against a webhook receiver that hangs throughout; an OOM (critical) fires a minute before the
end; the receiver then recovers. Figures: how long after the recovery the OOM alert, and the
newest state of every alert, arrived; target <= 10 s each.

Quick (the smoke test): a 3 s scrape after 2 s idle, 20 s of flapping.
"""

from __future__ import annotations

import http.server
import json
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vramscope.agent.ingest.connection import AgentConnection
from vramscope.agent.records import Event, Phase, Sample

from tools.agent_process import AgentProcess
from tools.bench import BenchOptions, Figure

GOOD_RECORDS = 760


class _Page(http.server.ThreadingHTTPServer):
    """Serves ``page()`` as /metrics."""

    def __init__(self, page: Callable[[], str]) -> None:
        self.page = page

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                body = server.page().encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = self
        super().__init__(("127.0.0.1", 0), Handler)
        self.daemon_threads = True
        threading.Thread(target=self.serve_forever, daemon=True).start()


def _hostile_page(value: str) -> Callable[[], str]:
    if value != "flap":
        return lambda: f"vllm:num_requests_running {value}\n"
    flips = iter(range(10**12))
    return lambda: f"vllm:num_requests_running {100_000 * (next(flips) % 2)}\n"


def scrape(value: str, seconds: float, idle_s: float) -> dict[str, Any]:
    hostile = [False]
    bad = _hostile_page(value)

    def serve() -> str:
        return bad() if hostile[0] else "vllm:num_requests_running 1\n"
    page = _Page(serve)
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        config = Path(d) / "vs.toml"
        config.write_text(f'[sources.prometheus]\ntargets = "http://127.0.0.1:'
                          f'{page.server_address[1]}/metrics"\ninterval_s = 0.1\n')
        agent = AgentProcess(f"sqlite:///{d}/vs.db", f"{d}/agent.sock", config_path=str(config),
                             log_path=f"{d}/agent.log").start()
        try:
            idle_rss = _watch(agent, idle_s, lambda: None)[0]
            hostile[0] = True
            with AgentConnection(agent.socket_path) as conn:
                conn.hello("good", pid=4242)
                sender = _good_client(conn, seconds)
                rss, status_max_s = _watch(agent, seconds, sender)
                scrapes = conn.status().get("prometheus")  # absent before issue 45
            written = _good_written(agent)
            log = Path(f"{d}/agent.log").read_text(errors="replace")
        finally:
            agent.stop()
            page.shutdown()
    return {"value": value, "seconds": seconds, "interval_s": 0.1, "idle_rss_bytes": idle_rss,
            "hostile_rss_max_bytes": rss, "rss_ratio": round(rss / idle_rss, 3),
            "good_sent": GOOD_RECORDS, "good_written": written,
            "status_max_s": round(status_max_s, 3),
            "refused_logged": "page refused" in log, "scrapes": scrapes}


def _good_client(conn: AgentConnection, seconds: float) -> Callable[[], None]:
    """A callable that sends the good client's samples due by now (760 over ``seconds``)."""
    start, sent = time.monotonic(), [0]

    def send_due() -> None:
        due = min(GOOD_RECORDS, int((time.monotonic() - start) / seconds * GOOD_RECORDS) + 1)
        batch = [Sample(time.time(), 0, Phase.DECODE, "good", 4242, allocated_bytes=k)
                 for k in range(sent[0], due)]
        if batch:
            conn.send_records(batch)
            sent[0] = due
    return send_due


def _watch(agent: AgentProcess, seconds: float, each: Callable[[], None]
           ) -> tuple[int, float]:
    """Every 0.1 s for ``seconds``: ``each()``, the agent's RSS; every second its status.
    Returns the largest RSS and the slowest status answer."""
    rss, slowest, end, next_status = 0, 0.0, time.monotonic() + seconds, 0.0
    while (now := time.monotonic()) < end:
        each()
        rss = max(rss, agent.rss_bytes())
        if now >= next_status:
            t0 = time.monotonic()
            agent.status()
            slowest, next_status = max(slowest, time.monotonic() - t0), now + 1.0
        time.sleep(0.1)
    each()
    return rss, slowest


def _good_written(agent: AgentProcess) -> int:
    import sqlite3

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and agent.status()["queue_depth"]:
        time.sleep(0.1)
    time.sleep(1.0)  # the writer's last batch
    with sqlite3.connect(agent.db_url.removeprefix("sqlite:///")) as db:
        (count,) = db.execute("SELECT count(*) FROM samples WHERE source = 'good'").fetchone()
    return int(count)


RULE = """
[alerts]
webhook_url = "{url}"
[[alerts.rules]]
name = "flappy"
metric = "allocated_bytes"
op = ">"
threshold = 50
"""


class _Receiver(http.server.ThreadingHTTPServer):
    """A webhook receiver that hangs (each POST until released) while ``hang`` is set."""

    def __init__(self) -> None:
        self.hang = threading.Event()
        self.released = threading.Event()
        self.got: list[tuple[float, dict[str, Any]]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if receiver.hang.is_set():
                    receiver.released.wait(600)
                    return  # never answered: the sender timed out long ago
                receiver.got.append((time.monotonic(), body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        receiver = self
        super().__init__(("127.0.0.1", 0), Handler)
        self.daemon_threads = True
        threading.Thread(target=self.serve_forever, daemon=True).start()


def webhook(minutes: float) -> dict[str, Any]:
    receiver = _Receiver()
    receiver.hang.set()
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        config = Path(d) / "vs.toml"
        config.write_text(RULE.format(url=f"http://127.0.0.1:{receiver.server_address[1]}/"))
        agent = AgentProcess(f"sqlite:///{d}/vs.db", f"{d}/agent.sock", config_path=str(config),
                             log_path=f"{d}/agent.log").start()
        try:
            with AgentConnection(agent.socket_path) as conn:
                conn.hello("flapper", pid=99)
                last = _flap(conn, minutes * 60.0)
                conn.status()
            before = agent.status()["alerts"]
            receiver.hang.clear()
            receiver.released.set()
            recovered = time.monotonic()
            arrived = _wait_newest(receiver, last, 60.0)
            after = agent.status()["alerts"]
        finally:
            agent.stop()
            receiver.shutdown()
    oom = [t for t, b in receiver.got if b["rule"] == "oom" and b["kind"] == "fired"]
    return {"minutes": minutes, "devices": 16, "webhook_timeout_s": 5.0,
            "oom_delivered_after_recovery_s": round(oom[0] - recovered, 3) if oom else None,
            "all_newest_after_recovery_s": (round(arrived - recovered, 3)
                                            if arrived is not None else None),
            "posts_received": len(receiver.got), "at_recovery": before, "at_end": after}


def _flap(conn: AgentConnection, seconds: float) -> dict[tuple[str, int], str]:
    """16 devices' samples alternating above and below the rule's threshold every 0.5 s, an
    OOM on device 0 a minute before the end; returns the newest state of each alert."""
    start, oom_at, flip = time.monotonic(), max(0.0, seconds - 60.0), 0
    newest: dict[tuple[str, int], str] = {}
    while (elapsed := time.monotonic() - start) < seconds:
        value = 100 * (flip % 2)
        conn.send_records([Sample(time.time(), d, Phase.DECODE, "flap", 99, allocated_bytes=value)
                           for d in range(16)])
        newest.update({("flappy", d): "fired" if value else "resolved" for d in range(16)})
        if elapsed >= oom_at and ("oom", 0) not in newest:
            conn.send_records([Event(time.time(), "oom", 0, 99, data={"bytes": 2**30})])
            newest[("oom", 0)] = "fired"
        flip += 1
        time.sleep(0.5)
    return newest


def _wait_newest(receiver: _Receiver, newest: dict[tuple[str, int], str],
                 timeout_s: float) -> float | None:
    """When the receiver held the newest state of every alert in ``newest``; None if never."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        held: dict[tuple[str, int], tuple[float, str]] = {}
        for t, body in list(receiver.got):
            held[(body["rule"], body["device"])] = (t, body["kind"])
        if all(held.get(k, (0.0, ""))[1] == kind for k, kind in newest.items()):
            return max(held[k][0] for k in newest)
        time.sleep(0.05)
    return None


SCRAPE_S, IDLE_S, FLAP_MINUTES = 37.0, 10.0, 5.0
RSS_TARGET = 1.10  # the agent's RSS under a hostile page, against its idle size
DELIVERY_TARGET_S = 10.0


def figures(options: BenchOptions) -> list[Figure]:
    """The scrape of the issue's 1e9 page, then the flapping rule against a hung receiver."""
    seconds, idle_s, minutes = ((3.0, 2.0, 20 / 60) if options.quick
                                else (SCRAPE_S, IDLE_S, FLAP_MINUTES))
    return [*scrape_figures(scrape("1e9", seconds, idle_s), "running 1e9"),
            *webhook_figures(webhook(minutes))]


def scrape_figures(r: dict[str, Any], what: str) -> list[Figure]:
    s = r["scrapes"] or {}
    return [Figure("limits", f"agent RSS scraping {what} for {r['seconds']:g} s, against idle",
                   r["rss_ratio"], "x",
                   spread=(f"{r['hostile_rss_max_bytes'] / 1e6:.1f} MB against "
                           f"{r['idle_rss_bytes'] / 1e6:.1f} MB idle; {s.get('refused_total')} "
                           f"of {s.get('scrapes_total')} scrapes refused; slowest status "
                           f"{r['status_max_s'] * 1e3:.0f} ms"),
                   baseline="the same agent's largest RSS scraping a healthy page",
                   target=f"<= {RSS_TARGET:g}", met=r["rss_ratio"] <= RSS_TARGET),
            Figure("limits", f"good client's samples written while scraping {what}",
                   100.0 * r["good_written"] / r["good_sent"], "%",
                   spread=f"{r['good_written']} of {r['good_sent']}", target="100",
                   met=r["good_written"] == r["good_sent"])]


def webhook_figures(r: dict[str, Any]) -> list[Figure]:
    hook = (r["at_end"] or {}).get("webhook") or {}
    spread = (f"{r['minutes'] * 60:.0f} s of a rule flapping on {r['devices']} devices "
              "every 0.5 s, "
              f"receiver hung throughout; {r['posts_received']} POSTs after; webhook "
              f"{hook.get('dropped')} dropped, {hook.get('coalesced')} coalesced")
    out = []
    for key, metric in (("oom_delivered_after_recovery_s",
                         "OOM alert delivered after a hung receiver recovered"),
                        ("all_newest_after_recovery_s",
                         "newest state of every alert delivered after the receiver recovered")):
        value = r[key]
        out.append(Figure("limits", metric, float("inf") if value is None else value, "s",
                          spread=spread, target=f"<= {DELIVERY_TARGET_S:g}",
                          met=value is not None and value <= DELIVERY_TARGET_S))
    return out
