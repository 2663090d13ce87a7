"""A recording proxy between a scraper and vLLM's ``/metrics``: what vLLM served to each scrape,
and when, so that a scraped sample is judged against the page it came from (issue 47: the
scrape "at its own scrape times"), not against another reader's request at a nearby moment.

Run as its own process (``python -m tests.vllm.metrics_recorder LISTEN_PORT UPSTREAM_URL
OUT``), so that the test's threads never delay the pages it relays: each ``GET`` is fetched
from ``UPSTREAM_URL`` and relayed unchanged (status 200 and its content type), and one JSON line
is appended to ``OUT`` per page, flushed at once::

    {"received_s": when the scraper's request arrived, "asked_s": when the page was asked of
     vLLM, "answered_s": when vLLM's response began (it renders the page before it answers),
     "replied_s": when the page was relayed in full, "usage": vllm:kv_cache_usage_perc on it}

``usage`` is null on a page without that gauge; an upstream failure is answered 502 and not
recorded (no page was served). ``ready`` on stdout once it listens.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

USAGE = re.compile(r"^vllm:kv_cache_usage_perc\{[^}]*\} ([0-9.eE+-]+)$", re.M)


class Recorder:
    """The upstream URL and the record file, one line per page relayed."""

    def __init__(self, upstream: str, out_path: str) -> None:
        self.upstream = upstream
        self._out = open(out_path, "a", encoding="utf-8")  # noqa: SIM115 - open while served
        self._lock = threading.Lock()

    def record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._out.write(json.dumps(entry) + "\n")
            self._out.flush()


def handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Relay(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            received = time.time()
            try:
                asked = time.time()
                with urllib.request.urlopen(recorder.upstream, timeout=10) as r:
                    answered = time.time()
                    body = r.read()
                    kind = r.headers.get("Content-Type", "text/plain")
            except OSError as exc:
                self.send_error(502, f"upstream: {exc}")
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            match = USAGE.search(body.decode("utf-8", errors="replace"))
            recorder.record({"received_s": received, "asked_s": asked, "answered_s": answered,
                             "replied_s": time.time(),
                             "usage": float(match.group(1)) if match else None})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base's name
            pass  # one line a scrape would flood the test's log

    return Relay


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m tests.vllm.metrics_recorder LISTEN_PORT UPSTREAM_URL OUT",
              file=sys.stderr)
        return 2
    port, upstream, out = int(argv[0]), argv[1], argv[2]
    server = ThreadingHTTPServer(("127.0.0.1", port), handler(Recorder(upstream, out)))
    print("ready", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
