"""``/metrics``' own families and text writer (dashboard/exposition.py) write what
``prometheus_client``'s families and ``generate_latest`` write, byte for byte: on scripted
families that reach every escape and number form, and on the seeded dashboard's scrape."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from vramscope.dashboard import exposition
from vramscope.dashboard.exposition import Family, LabelText

from tests.support import dashboard_fixtures as F

seeded, dash_app, client = F.seeded, F.dash_app, F.client  # shared fixtures

VALUES = (0, 1, -3, 999_999, 1_000_000, -999_999, -1_000_000, 80 * 2**30, 2**70, 0.5, -2.25,
          1e-7, 123456.789, 1234567.5, math.inf, -math.inf, math.nan, True, False)


def _scripted(label_text: LabelText) -> list[Family]:
    gauge = Family("g_bytes", 'Help with a \\ backslash,\na newline and "quotes".',
                   labels=("host", "device"), label_text=label_text)
    for i, value in enumerate(VALUES):
        gauge.add_metric([f"node-{i}", str(i)], value)
    gauge.add_metric(['a"quoted\\host\nname', "7"], 3)
    counter = Family("c_ooms", "A counter.", labels=("host",), kind="counter",
                     label_text=label_text)
    counter.add_metric(["h"], 4)
    counter.add_metric(["h2"], 2**40)
    bare = Family("up", "No labels.", label_text=label_text)
    bare.add_metric([], 1)
    unsorted = Family("order", "Label names out of order.", labels=("z", "a", "m"),
                      label_text=label_text)
    unsorted.add_metric(["1", "2", "3"], 5)
    unsorted.add_metric(["1", "2", "4"], 6)
    return [gauge, counter, bare, unsorted]


class _Prometheus:
    """A collector of the families as prometheus_client makes them."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter([f.prometheus_form() for f in self.families])


def _generate_latest(families) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Prometheus(families))
    return generate_latest(registry)


def test_scripted_families_are_written_as_generate_latest_writes_them():
    families = _scripted(LabelText())
    want = _generate_latest(families)
    assert exposition.text(families) == want
    # the forms the fast paths must keep: six digits plain, seven in Go's exponent form
    assert b'g_bytes{device="3",host="node-3"} 999999.0\n' in want
    assert b'g_bytes{device="4",host="node-4"} 1e+06\n' in want
    assert b'c_ooms_total{host="h"} 4.0\n' in want
    assert b'# TYPE c_ooms_total counter\n' in want


def test_a_label_set_is_escaped_once_and_forgotten_past_the_limit():
    label_text = LabelText(limit=3)
    first = label_text(("host", "device"), ("node-0", "0"))
    assert first == '{device="0",host="node-0"}'
    assert label_text(("host", "device"), ("node-0", "0")) is first
    for i in range(1, 4):
        label_text(("host",), (f"h{i}",))
    assert label_text(("host", "device"), ("node-0", "0")) is not first  # cleared at 3


def test_a_series_needs_a_value_for_each_label():
    fam = Family("g", "A gauge.", labels=("host", "device"))
    with pytest.raises(ValueError, match=r"g: 1 label values for \('host', 'device'\)"):
        fam.add_metric(["h"], 1)
    with pytest.raises(ValueError, match="a gauge or a counter, not 'summary'"):
        Family("s", "A summary.", kind="summary")


def test_the_seeded_scrape_is_generate_latest_s_text(client, dash_app):
    """The app's whole scrape, but the scrape's own duration (it differs each time)."""
    def steady(text: bytes) -> list[bytes]:
        return [line for line in text.splitlines()
                if not line.startswith(b"vramscope_scrape_duration_seconds ")]

    got = client.get("/metrics").get_data()
    families = list(dash_app.extensions["vramscope_collector"].collect())
    assert len(steady(got)) > 100
    assert steady(got) == steady(_generate_latest(families))
