"""The Prometheus source's requests and tokens from vLLM's own counters: scripted /metrics pages
(through the source's ``fetch`` seam) with ``vllm:request_success_total`` by finish reason,
prompt and generation tokens; counter resets; a garbage line refused naming the line, losing
nothing."""

from __future__ import annotations

import pytest
from vramscope.agent.sources.prometheus import PrometheusSource
from vramscope.agent.sources.prometheus_page import parse_exposition

from tests.agent.test_sources_prometheus import vllm_page

URL = "http://192.0.2.7:8000/metrics"  # elsewhere: no pid lookup
LABEL = "vllm@192.0.2.7:8000"


def page(running: int, stop: int, length: int, prompt: int, generated: int, *,
         queries: int = 0, hits: int = 0, waiting: int = 0) -> str:
    """vLLM 0.32's page with its success counter (one series per finish reason) and token
    counters, as its logger writes them."""
    m = 'engine="0",model_name="tiny"'
    return vllm_page(0.5, running, waiting, queries, hits, 0) + f"""\
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{{m},finished_reason="stop"}} {stop}.0
vllm:request_success_total{{{m},finished_reason="length"}} {length}.0
vllm:request_success_total{{{m},finished_reason="abort"}} 0.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{{m}}} {prompt}.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{{m}}} {generated}.0
"""


class Scripted:
    """The pages one target answers, in order (the source's fetch seam)."""

    def __init__(self) -> None:
        self.page = ""

    def __call__(self, url: str, timeout_s: float) -> str:
        return self.page


T0 = 1_700_000_000.0  # the fake clock's start


def _source(max_events: int = 128, clock=None):
    from vramscope.agent.clock import FakeClock
    from vramscope.agent.sources.scrape_bounds import ScrapeBounds

    got: list = []
    fetch = Scripted()
    src = PrometheusSource([URL], "vllm", got.extend, fetch=fetch,
                           clock=clock or FakeClock(T0),
                           bounds=ScrapeBounds(max_request_events=max_events))
    return src, fetch, got


def _requests(got: list) -> list[tuple[str, str]]:
    return [(e.name, e.request_id.rsplit("#", 1)[1]) for e in got
            if getattr(e, "name", None) in ("request_start", "request_end")]


def _named(got: list, name: str) -> list:
    return [e for e in got if getattr(e, "name", None) == name]


def test_requests_follow_the_success_counter_not_the_running_gauge():
    src, fetch, got = _source()
    clock = src.clock
    fetch.page = page(running=3, stop=10, length=5, prompt=1000, generated=400)
    src.run_once()
    # first scrape: the three running now start; the counters only set their baselines
    assert _requests(got) == [("request_start", "1"), ("request_start", "2"),
                              ("request_start", "3")]
    assert _named(got, "tokens") == []
    got.clear()
    # 7 finished (4 stop + 3 length) while the gauge stayed at 3: 7 ended, 7 started
    clock.advance(4.0)
    fetch.page = page(running=3, stop=14, length=8, prompt=1700, generated=650)
    src.run_once()
    assert _requests(got) == [("request_start", str(k)) for k in range(4, 11)] + [
        ("request_end", str(k)) for k in range(1, 8)]  # the oldest open ones end first
    assert _named(got, "tokens") == []  # 4 s of tokens: kept for one event of 10 s
    got.clear()
    # 2 more finished and the gauge fell to 0: nothing new started, the last three end
    clock.advance(6.0)
    fetch.page = page(running=0, stop=16, length=8, prompt=1700, generated=700)
    src.run_once()
    assert _requests(got) == [("request_end", "8"), ("request_end", "9"),
                              ("request_end", "10")]
    assert _named(got, "server_load")[0].data["running"] == 0
    # the tokens of the 10 s since the baseline scrape, in one event that says since when
    [tokens] = _named(got, "tokens")
    assert (tokens.ts_s, tokens.data) == (T0 + 10.0, {
        "prompt_tokens": 700, "generation_tokens": 300, "since_s": T0,
        "source": "prometheus", "target": LABEL})


def test_a_request_that_started_and_finished_between_scrapes_is_counted():
    src, fetch, got = _source()
    fetch.page = page(running=2, stop=0, length=0, prompt=0, generated=0)
    src.run_once()
    got.clear()
    # 3 finished, none running: the two open ones and one that came and went in between
    fetch.page = page(running=0, stop=3, length=0, prompt=0, generated=0)
    src.run_once()
    assert _requests(got) == [("request_start", "3"), ("request_end", "1"),
                              ("request_end", "2"), ("request_end", "3")]


def test_the_running_gauge_falling_below_the_finished_count_closes_the_open_ones():
    """Requests that left the batch without being counted finished: no start is made up, the
    open ones still follow the gauge."""
    src, fetch, got = _source()
    fetch.page = page(running=4, stop=0, length=0, prompt=0, generated=0)
    src.run_once()
    got.clear()
    fetch.page = page(running=1, stop=1, length=0, prompt=0, generated=0)
    src.run_once()
    assert _requests(got) == [("request_end", "1"), ("request_end", "2"),
                              ("request_end", "3")]
    assert src.targets[0].running == 1


def test_a_reset_counts_each_series_new_value_and_a_new_series_only_sets_its_baseline():
    src, fetch, got = _source()
    fetch.page = page(running=0, stop=50, length=20, prompt=9000, generated=3000)
    src.run_once()
    got.clear()
    # the server restarted: every series went down; each one's new value is its increase
    src.clock.advance(10.0)
    fetch.page = page(running=0, stop=2, length=1, prompt=300, generated=40)
    src.run_once()
    assert len(_named(got, "request_end")) == 3 and len(_named(got, "request_start")) == 3
    assert _named(got, "tokens")[0].data["prompt_tokens"] == 300
    assert _named(got, "tokens")[0].data["generation_tokens"] == 40
    got.clear()
    # a finish reason seen for the first time: its value is a baseline, not an increase
    fetch.page = page(running=0, stop=3, length=1, prompt=300, generated=40).replace(
        'finished_reason="abort"} 0.0', 'finished_reason="abort"} 0.0\n'
        'vllm:request_success_total{engine="0",model_name="tiny",finished_reason="error"} 9.0')
    src.run_once()
    assert len(_named(got, "request_end")) == 1


def test_more_requests_than_a_scrape_records_follow_on_the_next_scrapes():
    src, fetch, got = _source(max_events=10)
    fetch.page = page(running=0, stop=0, length=0, prompt=0, generated=0)
    src.run_once()
    fetch.page = page(running=0, stop=12, length=0, prompt=0, generated=0)
    counts = []
    for _ in range(3):
        got.clear()
        src.run_once()
        counts.append((len(_named(got, "request_start")), len(_named(got, "request_end"))))
    # 12 started and ended: 24 events at most 10 a scrape, the ends never ahead of the starts
    assert counts == [(5, 5), (5, 5), (2, 2)]
    assert src.targets[0].running == 0 and src.targets[0].backlog == (0, 0)


def test_a_garbage_line_is_refused_naming_the_line_and_its_counts_come_with_the_next_page(
        caplog):
    src, fetch, got = _source()
    fetch.page = page(running=1, stop=10, length=0, prompt=100, generated=50)
    src.run_once()
    got.clear()
    good = page(running=1, stop=14, length=0, prompt=500, generated=90)
    lines = good.splitlines()
    fetch.page = "\n".join([*lines[:5], "vllm:num_requests_running{engine= 3", *lines[5:]])
    with caplog.at_level("WARNING", logger="vramscope.prometheus"):
        assert src.run_once() == 0
    assert "line 6 is not a sample" in caplog.text
    assert "'vllm:num_requests_running{engine= 3'" in caplog.text
    assert src.counts()["failures_total"] == 1
    # the next good page: its increases cover the refused scrape's time, nothing is lost
    src.clock.advance(10.0)
    fetch.page = page(running=1, stop=20, length=0, prompt=900, generated=130)
    src.run_once()
    assert len(_named(got, "request_end")) == 10
    assert _named(got, "tokens")[0].data == {"prompt_tokens": 800, "generation_tokens": 80,
                                             "since_s": T0, "source": "prometheus",
                                             "target": LABEL}


@pytest.mark.parametrize("text, where", [
    ("a 1\nb notanumber\n", "line 2 is not a sample"),
    ("# HELP a x\n# TYPE a counter\na_total 1\n\nb{x=\"1\" 2\n", "line 5 is not a sample"),
])
def test_parse_names_the_bad_line(text, where):
    with pytest.raises(ValueError, match=where):
        parse_exposition(text)


def test_server_load_only_when_a_gauge_moves_not_with_each_finished_request():
    src, fetch, got = _source()
    fetch.page = page(running=3, stop=0, length=0, prompt=0, generated=0, waiting=1)
    src.run_once()
    assert [e.data["running"] for e in _named(got, "server_load")] == [3]
    got.clear()
    fetch.page = page(running=3, stop=5, length=0, prompt=0, generated=0, waiting=1)
    src.run_once()
    assert len(_named(got, "request_end")) == 5 and _named(got, "server_load") == []
    fetch.page = page(running=3, stop=5, length=0, prompt=0, generated=0, waiting=2)
    src.run_once()
    assert [e.data for e in _named(got, "server_load")] == [
        {"running": 3, "waiting": 2, "target": LABEL}]


def test_only_the_newest_pages_series_are_kept():
    """A label that changes with each scrape (a server bug, or a hostile page) cannot grow the
    source's state: each new series is a baseline, the old ones are forgotten."""
    src, fetch, got = _source()
    for k in range(50):
        fetch.page = ('vllm:num_requests_running 0\n'
                      f'vllm:request_success_total{{finished_reason="stop",nonce="{k}"}} '
                      f'{k}.0\n')
        src.run_once()
    assert list(src.targets[0].counters) == [
        ("vllm:request_success_total", (("finished_reason", "stop"), ("nonce", "49")))]
    assert _named(got, "request_end") == []
