"""``/metrics``' text writer (dashboard/exposition.py) writes exactly the bytes of
``prometheus_client.generate_latest``: on families shaped as /metrics makes them, on label
values that need escaping, and on families only the library's own path writes."""

from __future__ import annotations

import math

from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from vramscope.dashboard.exposition import text_format


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _both(families: list[Metric]) -> tuple[bytes, bytes]:
    return text_format(families), generate_latest(_Families(families))


def test_gauges_and_counters_as_metrics_makes_them():
    gauge = GaugeMetricFamily("vramscope_device_used_bytes", "Used.\nSecond \\ line.",
                              labels=("host", "device"))
    gauge.add_metric(["node-01", "0"], 1024)
    gauge.add_metric(["node-01", "1"], 3.5e12)
    gauge.add_metric(["node-02", "0"], 0.1)
    counter = CounterMetricFamily("vramscope_ooms", "OOMs.", labels=("host", "device"))
    counter.add_metric(["node-01", "0"], 7)
    # label names out of order: the line sorts them, as the library does
    unsorted = GaugeMetricFamily("vramscope_phase", "Phase.", labels=("phase", "host", "device"))
    unsorted.add_metric(["decode", "node-01", "0"], 1)
    bare = GaugeMetricFamily("vramscope_up", "Up.")
    bare.add_metric([], 1)
    empty = GaugeMetricFamily("vramscope_kv_saturated", "Saturated.", labels=("host",))
    mine, theirs = _both([gauge, counter, unsorted, bare, empty])
    assert mine == theirs
    assert mine.decode().splitlines()[:6] == [
        "# HELP vramscope_device_used_bytes Used.\\nSecond \\\\ line.",
        "# TYPE vramscope_device_used_bytes gauge",
        'vramscope_device_used_bytes{device="0",host="node-01"} 1024.0',
        'vramscope_device_used_bytes{device="1",host="node-01"} 3.5e+12',
        'vramscope_device_used_bytes{device="0",host="node-02"} 0.1',
        "# HELP vramscope_ooms_total OOMs."]


def test_label_values_and_numbers_that_need_escaping_or_words():
    gauge = GaugeMetricFamily("g", "h", labels=("process", "pid"))
    gauge.add_metric(['say "hi"\\now\nthen', ""], math.nan)
    gauge.add_metric(["é", "1"], math.inf)
    gauge.add_metric(["x", "2"], -math.inf)
    gauge.add_metric(["y", "3"], -0.0)
    mine, theirs = _both([gauge])
    assert mine == theirs
    assert 'g{pid="",process="say \\"hi\\"\\\\now\\nthen"} NaN' in mine.decode()


def test_families_the_short_path_leaves_to_the_library():
    created = CounterMetricFamily("c", "with created", labels=("a",), created=12.0)
    created.add_metric(["1"], 2, created=13.0)
    stamped = GaugeMetricFamily("s", "timestamped", labels=("a",))
    stamped.add_metric(["1"], 2, timestamp=1700000000.5)
    hist = HistogramMetricFamily("h", "a histogram", buckets=[("1", 1), ("+Inf", 2)],
                                 sum_value=3)
    info = InfoMetricFamily("i", "an info", value={"version": "1"})
    odd = GaugeMetricFamily("odd", "a label name outside the legacy set", labels=("a.b",))
    odd.add_metric(["1"], 1)
    mine, theirs = _both([created, stamped, hist, info, odd])
    assert mine == theirs
