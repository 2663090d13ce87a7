"""The Prometheus text format of ``/metrics``: the bytes ``prometheus_client.generate_latest``
writes, made in a fraction of its time.

A 512-device fleet's scrape is ~16k sample lines. ``generate_latest`` checks and escapes every
label name of every line (three names a line: ~280 ms of the scrape's CPU on the fleet
store); the label names of a family are the same on each of its lines, so here they are
escaped once per family and label set, and each line costs a join. Only what ``/metrics``
makes takes the short path (gauge and counter families whose samples carry no timestamp,
exemplar or OpenMetrics-only suffix); any other family is written by ``generate_latest``
itself, so the output is its output either way (tests/dashboard/test_metrics_exposition.py
compares them).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import (
    UNDERSCORES,
    escape_label_name,
    escape_metric_name,
)
from prometheus_client.utils import floatToGoString as _untyped_float_text

# samples generate_latest moves into gauge families of their own after the family's lines
_OPENMETRICS_SUFFIXES = ("_created", "_gsum", "_gcount")


def text_format(families: Iterable[Metric]) -> bytes:
    """``generate_latest``'s text (Prometheus format, UTF-8) of ``families``, in order."""
    out: list[str] = []
    for metric in families:
        lines = _simple_lines(metric)
        out.append(lines if lines is not None else _library_lines(metric))
    return "".join(out).encode("utf-8")


def _simple_lines(metric: Metric) -> str | None:
    """A gauge or counter family's text as ``generate_latest`` writes it, or None where the
    family needs more than the short path knows."""
    if metric.type not in ("gauge", "counter"):
        return None
    created = [metric.name + s for s in _OPENMETRICS_SUFFIXES]
    if any(s.timestamp is not None or s.exemplar is not None or s.name in created
           for s in metric.samples):
        return None
    name = escape_metric_name(metric.name + ("_total" if metric.type == "counter" else ""),
                              UNDERSCORES)
    doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    out = [f"# HELP {name} {doc}\n# TYPE {name} {metric.type}\n"]
    sample_names: dict[str, str] = {}
    # a label set (its names in the family's order) -> the names escaped and sorted, with
    # each one's position in that order
    orders: dict[tuple[str, ...], list[tuple[str, int]]] = {}
    for s in metric.samples:
        sample_name = sample_names.get(s.name)
        if sample_name is None:
            sample_name = sample_names[s.name] = escape_metric_name(s.name, UNDERSCORES)
        value = _number_text(s.value)
        if not s.labels:
            out.append(f"{sample_name} {value}\n")
            continue
        keys = tuple(s.labels)
        order = orders.get(keys)
        if order is None:
            order = orders[keys] = [(escape_label_name(k, UNDERSCORES), i)
                                    for i, k in sorted(enumerate(keys), key=lambda t: t[1])]
        values = list(s.labels.values())
        labels = ",".join(f'{k}="{_escape_value(values[i])}"' for k, i in order)
        out.append(f"{sample_name}{{{labels}}} {value}\n")
    return "".join(out)


def _number_text(value: float) -> str:
    """The library's number text (Go's float format), typed."""
    text: str = _untyped_float_text(value)  # type: ignore[no-untyped-call]
    return text


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _library_lines(metric: Metric) -> str:
    """``generate_latest``'s own text of one family."""
    return generate_latest(_OneFamily(metric)).decode("utf-8")


class _OneFamily:
    """A collector of one family, for ``generate_latest``."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]
