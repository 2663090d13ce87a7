"""``/metrics``' families and their Prometheus text format (0.0.4), written here instead of
through ``prometheus_client``'s metric families and ``generate_latest``.

A fleet of 64 hosts of 8 GPUs is 16,000 series a scrape. ``prometheus_client`` makes a sample
tuple and a label dict for each series, then validates and escapes every label name and value
again when it writes them (a regular expression per name): more CPU than reading the whole
fleet from the store, on a machine whose cores the fleet's agents already keep busy. A
:class:`Family` here keeps each series as its written line: the label names' sorted order is
found once a family, and a label set's text is escaped once a scrape (a device's ``host`` and
``device`` recur in every device family). The text is ``generate_latest``'s, byte for byte
(``tests/dashboard/test_metrics_exposition.py``): the same ``# HELP``/``# TYPE`` lines,
counters named ``_total``, label names sorted, label values escaped, values as Go writes
floats (``floatToGoString``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString


def _escaped(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class LabelText:
    """Each label set's ``{name="value",...}`` text, escaped once and reused: by every family
    of a scrape, and by the next scrape (a fleet's label sets change only as processes come
    and go). Forgotten all at once past ``limit`` sets, so ended processes' do not pile up;
    shared by concurrent scrapes, which is safe: an entry is the same text whoever adds it."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._seen: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}

    def __call__(self, names: tuple[str, ...], values: tuple[str, ...]) -> str:
        key = (names, values)
        text = self._seen.get(key)
        if text is None:
            text = "{" + ",".join(f'{n}="{_escaped(v)}"'
                                  for n, v in sorted(zip(names, values))) + "}"
            if len(self._seen) >= self.limit:
                self._seen.clear()
            self._seen[key] = text
        return text


LABEL_TEXT = LabelText()  # the process's: label sets outlive a scrape


def value_text(value: float) -> str:
    """A sample's value as ``floatToGoString`` writes it; an int of up to six digits (whose
    float's repr has no exponent) without the call."""
    if type(value) is int and -1_000_000 < value < 1_000_000:
        return f"{value}.0"
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]  # untyped upstream


class Family:
    """A gauge or counter family and its series, each kept as the line it is written as."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str] = (),
                 *, kind: str = "gauge", label_text: LabelText | None = None) -> None:
        if kind not in ("gauge", "counter"):
            raise ValueError(f"a /metrics family is a gauge or a counter, not {kind!r}")
        # a counter's series, HELP and TYPE are all named with _total (generate_latest's)
        self.name = name + ("_total" if kind == "counter" else "")
        self.base_name, self.documentation, self.kind = name, documentation, kind
        self.labels = tuple(labels)
        self._label_text = label_text or LABEL_TEXT
        self.lines: list[str] = []
        self.series: list[tuple[tuple[str, ...], float]] = []  # for prometheus_form

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        values = tuple(labels)
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name}: {len(values)} label values for {self.labels}")
        text = self._label_text(self.labels, values) if values else ""
        self.lines.append(f"{self.name}{text} {value_text(value)}\n")
        self.series.append((values, value))

    def text(self) -> str:
        doc = self.documentation.replace("\\", r"\\").replace("\n", r"\n")
        return f"# HELP {self.name} {doc}\n# TYPE {self.name} {self.kind}\n" + "".join(
            self.lines)

    def prometheus_form(self) -> Metric:
        """The same family as ``prometheus_client`` makes it (for the tests that hold the
        text to ``generate_latest``'s)."""
        kind = GaugeMetricFamily if self.kind == "gauge" else CounterMetricFamily
        family = kind(self.base_name, self.documentation, labels=self.labels)
        for values, value in self.series:
            family.add_metric(list(values), value)
        return family


def text(families: Iterable[Family]) -> bytes:
    """The families in the Prometheus text format, in their order."""
    return "".join(f.text() for f in families).encode("utf-8")
