"""The Prometheus scrape source against a hostile local server (issue 32, "never tested yet"):
slow (a page trickled for longer than the timeout), a 100 MB body, malformed exposition text,
redirects, a 500 storm. Each scrape ends within its time bound, reads a bounded amount,
counts a failure and logs once; NVML sampling goes on meanwhile."""

from __future__ import annotations

import http.server
import logging
import threading
import time
import tracemalloc

import pytest
from vramscope.agent.config import parse_config
from vramscope.agent.daemon import Agent
from vramscope.agent.sources.nvml import FakeNvmlSource
from vramscope.agent.sources.prometheus import MAX_BODY_BYTES, PrometheusSource

from tests.support.waiting import wait_for

TIMEOUT_S = 0.5
GOOD = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"


class _Hostile(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        mode = self.path.strip("/")
        if mode == "redirect":
            self.send_response(302)
            self.send_header("Location", "/ok")
            self.end_headers()
            return
        if mode == "error":
            self.send_response(500)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        try:
            if mode == "slow":  # a byte at a time: never a read timeout, never the end
                for _ in range(200):
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    time.sleep(0.05)
            elif mode == "huge":  # 100 MB
                block = b"# " + b"x" * 65_534 + b"\n"
                for _ in range(100 * 2**20 // len(block)):
                    self.wfile.write(block)
            elif mode == "malformed":
                self.wfile.write(b"vllm:num_requests_running{unclosed 1\n\x00\xff garbage\n")
            else:
                self.wfile.write(GOOD.encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # the scraper gave up: what it should do


@pytest.fixture(scope="module")
def hostile():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _source(url: str, got: list) -> PrometheusSource:
    return PrometheusSource([url], "vllm", got.extend, timeout_s=TIMEOUT_S)


@pytest.mark.parametrize("mode", ["slow", "huge", "malformed", "redirect", "error"])
def test_a_hostile_page_is_one_counted_failure_in_bounded_time_and_memory(hostile, mode,
                                                                           caplog):
    got: list = []
    source = _source(f"{hostile}/{mode}", got)
    tracemalloc.start()
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, "vramscope.prometheus"):
        assert source.run_once() == 0
    took = time.monotonic() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert (source.scrapes_total, source.failures_total, got) == (1, 1, [])
    assert took < 2 * TIMEOUT_S + 0.5  # the per-read timeout after the total one, at most
    assert peak < 3 * MAX_BODY_BYTES  # the page's bytes, joined once, and its text
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"Prometheus target {hostile}/{mode}: ")
    if mode == "redirect":
        assert line.endswith(f": HTTP 302 (redirect to {hostile}/ok not followed; name the "
                             "final URL in sources.prometheus.targets); no KV or request "
                             "records from it until it answers (sources.prometheus.targets)")
    if mode == "slow":
        assert "page not complete after 0.5 s" in line


def test_a_500_storm_is_counted_and_logged_once_then_recovery_once(hostile, caplog):
    got: list = []
    source = _source(f"{hostile}/error", got)
    with caplog.at_level(logging.INFO, "vramscope.prometheus"):
        for _ in range(50):
            source.run_once()
        source.targets[0].url = f"{hostile}/ok"
        assert source.run_once() > 0
    assert (source.scrapes_total, source.failures_total) == (51, 50)
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]


def test_nvml_sampling_goes_on_while_the_target_is_slow(hostile, tmp_path):
    from vramscope.agent.store import Store

    store = Store.open(f"sqlite:///{tmp_path / 'p.db'}", host_name="h")
    config = parse_config({"sampling": {"device_interval_s": 0.1},
                           "sources": {"prometheus": {"targets": f"{hostile}/slow",
                                                      "timeout_s": TIMEOUT_S,
                                                      "interval_s": 0.05}}}, None, {})
    agent = Agent(config, store=store, source=FakeNvmlSource(1, 2**30), listen=False,
                  alerts=False)
    agent.start()
    try:
        time.sleep(2.0)
        assert agent.prometheus is not None and agent.prometheus.failures_total >= 2
    finally:
        agent.stop()

    def nvml():
        return len(store.samples(0, source="nvml"))
    assert wait_for(lambda: nvml() >= 15)  # 10 Hz for 2 s, on time while every scrape hangs
    store.close()


# --- issue 45: a scrape is a bounded input ----------------------------------------------------

def _paged(pages: list[str], got: list, **kwargs: object) -> PrometheusSource:
    """A source whose fetch serves ``pages`` in turn (the last one from then on)."""
    def fetch(url: str, timeout_s: float) -> str:
        return pages.pop(0) if len(pages) > 1 else pages[0]
    return PrometheusSource(["http://127.0.0.1:9/metrics"], "vllm", got.extend, fetch=fetch,
                            **kwargs)


def test_a_running_gauge_of_1e5_makes_a_bounded_number_of_records():
    got: list = []
    source = _paged(["vllm:num_requests_running 100000\n"], got)
    source.run_once()
    assert len(got) <= source.bounds.max_records == 133
    [load] = [r for r in got if r.name == "server_load"]
    assert load.data["running"] == 100_000  # the gauge itself is exact, at once


def test_a_flapping_gauge_never_floods_the_writer():
    got: list = []
    pages = ["vllm:num_requests_running 0\n", "vllm:num_requests_running 100000\n"] * 10
    source = _paged(pages, got)
    for _ in range(20):
        source.run_once()
    assert len(got) <= 20 * (128 + 4)


def test_a_large_real_move_is_followed_over_the_next_scrapes():
    got: list = []
    source = _paged(["vllm:num_requests_running 300\n"], got)
    counts = [source.run_once() for _ in range(4)]
    starts = [r.request_id for r in got if r.name == "request_start"]
    assert counts == [129, 129, 45, 0]  # 128 slots + server_load, twice, then the last 44
    assert starts == [f"vllm@127.0.0.1:9#{k}" for k in range(1, 301)]
    assert source.targets[0].running == 300


@pytest.mark.parametrize("value", ["1e9", "-5", "NaN", "+Inf"])
def test_a_gauge_out_of_bounds_refuses_the_whole_scrape_and_says_which(value, caplog):
    got: list = []
    page = (f"vllm:num_requests_running {value}\nvllm:num_requests_waiting 3\n"
            "vllm:kv_cache_usage_perc 0.5\n")
    source = _paged([page], got)
    with caplog.at_level(logging.WARNING, "vramscope.prometheus"):
        assert source.run_once() == 0
    assert (got, source.refused_total, source.failures_total) == ([], 1, 1)
    [line] = [r.getMessage() for r in caplog.records]
    assert "page refused: vllm:num_requests_running = " in line
    assert source.counts() == {"scrapes_total": 1, "failures_total": 1, "refused_total": 1,
                               "targets_answering": 0}


@pytest.mark.parametrize("line", ["vllm:kv_cache_usage_perc 1.5", "vllm:kv_cache_usage_perc NaN",
                                  "vllm:num_requests_waiting 2e6",
                                  "vllm:num_preemptions_total 1e300",
                                  'vllm:cache_config_info{num_gpu_blocks="1e12"} 1'])
def test_every_number_used_is_bounded(line):
    got: list = []
    source = _paged([line + "\n"], got)
    assert source.run_once() == 0
    assert source.refused_total == 1


def test_label_sets_add_up_to_the_cap():
    got: list = []
    page = "".join(f'vllm:num_requests_running{{engine="{k}"}} 600000\n' for k in range(2))
    source = _paged([page], got)
    assert source.run_once() == 0 and source.refused_total == 1


def test_the_caps_come_from_the_settings():
    config = parse_config({"sources": {"prometheus": {
        "targets": "http://127.0.0.1:9/metrics", "max_requests": 50,
        "max_request_events": 5}}}, None, {})
    source = PrometheusSource.from_config(config, [].extend)
    assert source is not None and tuple(source.bounds) == (50, 5)
    assert source.targets[0].max_request_events == 5


def test_a_slow_target_does_not_delay_the_others():
    """One target taking its whole timeout each scrape; the other keeps its 0.1 s schedule
    (scraped one after the other, it got one scrape per slow timeout)."""
    scrapes = {"slow": 0, "fast": 0}

    def fetch(url: str, timeout_s: float) -> str:
        name = url.rsplit("/", 1)[1]
        scrapes[name] += 1
        if name == "slow":
            time.sleep(timeout_s)
        return GOOD

    source = PrometheusSource(["http://127.0.0.1:9/slow", "http://127.0.0.1:9/fast"], "vllm",
                              [].extend, interval_s=0.1, timeout_s=0.5, fetch=fetch)
    source.start()
    time.sleep(1.5)
    source.stop()
    assert scrapes["slow"] <= 4 and scrapes["fast"] >= 10, scrapes


@pytest.mark.slow
def test_a_hostile_gauge_leaves_the_agent_answering_and_a_good_client_whole():
    """A real agent scraping ``vllm:num_requests_running 1e6`` ten times a second (it made a
    million records a scrape: the writer dropped a good client's samples) while a hook client
    sends 760 samples: all written, status answers at once, memory stays at its idle size."""
    from tools.bench.hostile import scrape

    result = scrape("1e6", seconds=5.0, idle_s=2.0)
    assert result["good_written"] == result["good_sent"] == 760
    assert result["status_max_s"] < 1.0
    assert result["rss_ratio"] < 1.1  # 1e6 is at the cap: followed 128 requests a scrape


def test_more_records_than_one_scrape_may_make_is_refused_naming_the_setting():
    from vramscope.agent.sources.scrape_bounds import ScrapeBounds, ScrapeRefused

    bounds = ScrapeBounds(max_requests=10, max_request_events=5)
    bounds.check_records(10)
    with pytest.raises(ScrapeRefused, match=r"11 records from one scrape, more than 10 "
                                            r"\(sources.prometheus.max_request_events \+ 5\)"):
        bounds.check_records(11)
