"""The Prometheus source: scripted /metrics pages from a real HTTP server on loopback, parsed by
prometheus_client, mapped to records and written by a real agent to a real SQLite store."""

from __future__ import annotations

import http.server
import logging
import os
import subprocess
import sys
import threading

import pytest
from vramscope.agent.config import parse_config
from vramscope.agent.daemon import Agent
from vramscope.agent.errors import ConfigError
from vramscope.agent.records import Phase, Sample
from vramscope.agent.sources.prometheus import PrometheusSource
from vramscope.agent.sources.prometheus_target import RATIO_SCALE

from tests.support.waiting import wait_for


def vllm_page(usage: float, running: int, waiting: int, queries: int, hits: int,
              preemptions: int) -> str:
    """What vLLM 0.32's /metrics says (names and label layout as its logger writes them)."""
    m = 'engine="0",model_name="tiny"'
    return f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{m}}} {running}.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{m}}} {waiting}.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{m}}} {usage}
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{{m}}} {queries}.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{{m}}} {hits}.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{{m}}} {preemptions}.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",engine="0",num_gpu_blocks="400"}} 1.0
"""


class Pages:
    """A real HTTP server on loopback serving the page the test sets (or an error status)."""

    def __init__(self) -> None:
        self.page, self.status = "", 200
        self.serving = lambda: None  # what else happens while a page is served
        pages = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                pages.serving()
                body = pages.page.encode()
                self.send_response(pages.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def pages():
    p = Pages()
    yield p
    p.close()


def _source(url: str, preset: str = "vllm", clock=None):
    got: list = []
    kwargs = {"clock": clock} if clock else {}
    return PrometheusSource([url], preset, got.extend, device=1, **kwargs), got


def test_vllm_page_becomes_kv_sample_request_slots_and_counter_increases(pages, fake_clock):
    src, got = _source(pages.url, clock=fake_clock)
    pages.page = vllm_page(0.25, 2, 1, 100, 40, 3)
    assert src.run_once() == 4
    sample, start1, start2, load = got
    assert (sample.source, sample.device, sample.phase, sample.kv_blocks_used,
            sample.kv_blocks_total, sample.kv_blocks_cached) == (
        "prometheus", 1, Phase.UNKNOWN, 100, 399, None)  # 399: vLLM's null block is not usable
    host = pages.url.split("/")[2]
    assert [(e.name, e.request_id) for e in (start1, start2)] == [
        ("request_start", f"vllm@{host}#1"), ("request_start", f"vllm@{host}#2")]
    assert start1.data == {"synthetic": True, "source": "prometheus"}
    assert (load.name, load.data) == ("server_load", {"running": 2, "waiting": 1,
                                                      "target": f"vllm@{host}"})
    # first scrape: counters only set the baseline
    got.clear()
    fake_clock.advance(1.0)
    pages.page = vllm_page(0.5, 0, 0, 164, 72, 5)
    src.run_once()
    names = [(e.name, getattr(e, "request_id", None)) for e in got[1:]]
    assert got[0].kv_blocks_used == 200  # round(0.5 * 399)
    assert names == [("request_end", f"vllm@{host}#2"), ("request_end", f"vllm@{host}#1"),
                     ("server_load", None), ("kv_preempted", None), ("prefix_cache", None)]
    assert got[-2].data["count"] == 2
    assert (got[-1].data["query_tokens"], got[-1].data["hit_tokens"]) == (64, 32)
    assert all(r.ts_s == 1_700_000_001.0 for r in got)
    # the page is served by this process, on loopback: every record is its
    assert {r.pid for r in got} == {os.getpid()}


def test_records_carry_the_scrapes_time_the_middle_of_the_fetch(pages, fake_clock):
    """A scrape that takes 0.4 s (a busy server): its records stand at the middle of the
    fetch, when the server made the page, not at its end nor after the parse."""
    src, got = _source(pages.url, clock=fake_clock)
    pages.page = vllm_page(0.25, 0, 0, 100, 40, 3)
    pages.serving = lambda: fake_clock.advance(0.4)
    asked = fake_clock.time_s()
    src.run_once()
    assert [type(r).__name__ for r in got] == ["Sample", "Event"]  # the KV pool, the load
    assert {r.ts_s for r in got} == {asked + 0.2}


def test_unchanged_gauges_make_a_sample_only_and_a_reset_counter_counts_its_new_value(pages):
    src, got = _source(pages.url)
    pages.page = vllm_page(0.1, 1, 0, 100, 40, 3)
    src.run_once()
    got.clear()
    src.run_once()
    assert [type(r).__name__ for r in got] == ["Sample"]
    got.clear()
    pages.page = vllm_page(0.1, 1, 0, 100, 40, 1)  # the server restarted: preemptions 3 -> 1
    src.run_once()
    assert [(e.name, e.data["count"]) for e in got[1:]] == [("kv_preempted", 1)]


def test_sglang_counts_tokens_and_tgi_gives_requests_without_kv(pages):
    src, got = _source(pages.url, "sglang")
    pages.page = ('sglang:token_usage{model_name="m"} 0.28\n'
                  'sglang:max_total_num_tokens{model_name="m"} 161721\n'
                  'sglang:num_running_reqs{model_name="m"} 1\n'
                  'sglang:num_queue_reqs{model_name="m"} 0\n')
    src.run_once()
    assert (got[0].kv_blocks_used, got[0].kv_blocks_total) == (round(0.28 * 161721), 161721)
    src, got = _source(pages.url, "tgi")
    pages.page = "tgi_batch_current_size 3\ntgi_queue_size 4\n"
    src.run_once()
    assert [e.name for e in got] == ["request_start"] * 3 + ["server_load"]
    assert got[-1].data["waiting"] == 4


def test_engines_add_up_their_pools_and_average_their_usage(pages):
    src, got = _source(pages.url)
    pages.page = ('vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
                  'vllm:kv_cache_usage_perc{engine="1"} 0.25\n'
                  'vllm:cache_config_info{engine="0",num_gpu_blocks="101"} 1\n'
                  'vllm:cache_config_info{engine="1",num_gpu_blocks="101"} 1\n')
    src.run_once()
    assert (got[0].kv_blocks_used, got[0].kv_blocks_total) == (75, 200)  # 0.375 * (2 * 100)


def test_usage_without_a_published_pool_size_is_counted_in_ratio_parts(pages):
    src, got = _source(pages.url)
    pages.page = 'vllm:kv_cache_usage_perc{engine="0"} 0.125\n'
    src.run_once()
    assert (got[0].kv_blocks_used, got[0].kv_blocks_total) == (RATIO_SCALE // 8, RATIO_SCALE)


def test_a_failing_target_logs_once_and_recovers(pages, caplog):
    src, got = _source(pages.url)
    pages.status = 500
    with caplog.at_level(logging.INFO, logger="vramscope.prometheus"):
        assert src.run_once() == 0
        assert src.run_once() == 0
        pages.status, pages.page = 200, "not a metric line {"
        assert src.run_once() == 0
        pages.page = vllm_page(0.5, 0, 0, 0, 0, 0)
        assert src.run_once() == 2  # sample + the first server_load
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "HTTP 500" in m]) == 1
    assert lines[-1].endswith("answers again") and len(lines) == 2
    assert (src.scrapes_total, src.failures_total) == (4, 3)


def test_nothing_listening_is_a_log_line_not_an_exception():
    src, got = _source("http://127.0.0.1:9/metrics")
    assert src.run_once() == 0 and got == []


def test_bad_preset_and_interval_are_refused_naming_the_value():
    with pytest.raises(ValueError, match="'vlm'"):
        PrometheusSource([], "vlm", print)
    with pytest.raises(ValueError, match="interval_s must be > 0, got 0"):
        PrometheusSource([], "vllm", print, interval_s=0)


def test_config_reads_the_sources_prometheus_table_and_checks_urls():
    c = parse_config({"sources": {"prometheus": {"targets": "http://a:1/metrics, http://b:2/m",
                                                 "preset": "tgi"}}}, "v.toml")
    assert PrometheusSource.from_config(c, print).targets[1].url == "http://b:2/m"
    assert PrometheusSource.from_config(parse_config({}, None), print) is None
    with pytest.raises(ConfigError, match=r"v.toml: sources.prometheus.targets = 'a:1'"):
        parse_config({"sources": {"prometheus": {"targets": "a:1"}}}, "v.toml")
    with pytest.raises(ConfigError, match="one of vllm, sglang, tgi"):
        parse_config({"sources": {"prometheus": {"preset": "x"}}}, "v.toml")


def test_the_agent_scrapes_on_its_own_thread_into_the_store(pages, store):
    pages.page = vllm_page(0.75, 1, 0, 0, 0, 0)
    config = parse_config({"sources": {"prometheus": {"targets": pages.url,
                                                      "interval_s": 0.05}}}, None)
    agent = Agent(config, store=store, source=None, listen=False, alerts=False)
    agent.start()
    try:
        def landed():
            agent.writer.flush()
            return store.samples(source="prometheus")
        sample = wait_for(landed)[0]
    finally:
        agent.stop()
    assert (sample.kv_blocks_used, sample.kv_blocks_total) == (299, 399)
    starts = store.events(names=("request_start",))
    assert len(starts) == 1 and starts[0].request_id.endswith("#1")
    # the server behind the target (this process, listening on the port) has its process row:
    # what the Overview lists, as it lists a server the plugin reports
    port = pages.url.split(":")[2].split("/")[0]
    (row,) = [p for p in store.processes() if p["pid"] == os.getpid()]
    assert (row["name"], row["model"], row["devices"]) == (f"vllm server (port {port})",
                                                            "tiny", "0")
    assert sample.pid == starts[0].pid == os.getpid()
    # the target that answers is one of the agent's clients (Sampling health), as a server
    # connected to the socket would be
    assert store.latest_agent_stats()["clients"] == 1
    assert agent.status()["prometheus"]["targets_answering"] == 1


def test_a_target_elsewhere_has_no_pid_and_no_process_row():
    """Only a target on this host can be looked up in /proc: another host's is never searched
    (a port number there says nothing of the processes here)."""
    noted: list = []

    def no_lookup(port: int) -> int | None:
        raise AssertionError(f"looked up port {port} for a remote target")

    got: list = []
    src = PrometheusSource(["http://10.20.30.40:8000/metrics"], "vllm", got.extend,
                           fetch=lambda url, timeout: vllm_page(0.5, 1, 0, 0, 0, 0),
                           find_pid=no_lookup, note_process=lambda *a: noted.append(a))
    assert src.run_once() == 3
    assert {r.pid for r in got} == {None} and noted == []


SERVE_CHILD = """
import http.server, sys
page = sys.argv[2].encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", str(len(page)))
        self.end_headers(); self.wfile.write(page)
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
print("ready", flush=True)
s.serve_forever()
"""


def _serve_child(port: int) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", SERVE_CHILD, str(port),
                              vllm_page(0.5, 1, 0, 0, 0, 0)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def test_a_server_restarted_on_its_port_is_the_new_pid_after_the_gap(fake_clock):
    """The server is another process on this host (a sidecar's case): its pid is found by the
    port; it restarts on the same port with a new pid, and the records after the gap carry the
    new one, its process row noted at once."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    noted: list = []
    got: list = []
    src = PrometheusSource([f"http://127.0.0.1:{port}/metrics"], "vllm", got.extend,
                           clock=fake_clock, note_process=lambda *a: noted.append(a))
    first = _serve_child(port)
    try:
        src.run_once()
        fake_clock.advance(1.0)
        src.run_once()
    finally:
        first.terminate()
        first.wait()
    fake_clock.advance(1.0)
    assert src.run_once() == 0  # nothing listens: no records
    second = _serve_child(port)
    try:
        fake_clock.advance(1.0)
        src.run_once()
    finally:
        second.terminate()
        second.wait()
    assert first.pid != second.pid
    assert [r.pid for r in got if isinstance(r, Sample)] == [first.pid, first.pid, second.pid]
    assert {r.pid for r in got if r.pid != second.pid} == {first.pid}
    name = f"vllm server (port {port})"
    t0 = 1_700_000_000.0
    assert noted == [(first.pid, t0, name, "tiny", 0), (second.pid, t0 + 3, name, "tiny", 0)]


@pytest.mark.parametrize(("url", "port", "local"), [
    ("http://127.0.0.1:8000/metrics", 8000, True), ("http://[::1]/metrics", 80, True),
    ("https://localhost/metrics", 443, True), ("http://10.20.30.40:9090/metrics", 9090, False),
    ("http://127.0.0.1:notaport/metrics", 0, False)])
def test_which_targets_are_looked_up_and_on_which_port(url, port, local):
    """The URL's port (the scheme's default without one) and whether the host is this one;
    a URL whose port is not a number names no process (its fetch fails and says why)."""
    from vramscope.agent.sources.prometheus_page import PRESETS
    from vramscope.agent.sources.prometheus_target import TargetState

    target = TargetState(url, PRESETS["vllm"])
    assert (target.port, target.local) == (port, local)
