"""The metric table (agent/alerts/metrics.py): every metric a rule, the engine or the Prometheus
rules name resolves in it or in the sample fields; every row has a unit, a meaning and inputs,
and its value is written by its unit; docs/alerts.md lists every row."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from vramscope.agent.alerts import engine, prom_rules
from vramscope.agent.alerts import metrics as m
from vramscope.agent.alerts.rules import METRICS, builtin_rules, format_value
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("agent", "dashboard")
SKIPPED = ("agent/bench/",)


def metrics_named(tree: ast.AST) -> set[str]:
    """The metric names a module spells out: ``Rule(name, "metric", ...)``, ``Gate("metric",
    ...)``, ``horizon="metric"`` and ``rule.metric == "metric"``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            place = {"Rule": 1, "Gate": 0}.get(name or "")
            if place is not None and len(node.args) > place \
                    and isinstance(node.args[place], ast.Constant):
                found.add(node.args[place].value)
            found.update(kw.value.value for kw in node.keywords
                         if kw.arg in ("metric", "horizon") and isinstance(kw.value, ast.Constant)
                         and isinstance(kw.value.value, str))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "metric" for s in sides):
                found.update(s.value for s in sides
                             if isinstance(s, ast.Constant) and isinstance(s.value, str))
    return found


def test_every_metric_the_code_names_resolves():
    used: dict[str, set[str]] = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(SKIPPED):
                continue
            for name in metrics_named(ast.parse(path.read_text(encoding="utf-8"), rel)):
                used.setdefault(name, set()).add(rel)
    assert {n: sorted(f) for n, f in used.items() if n not in METRICS} == {}
    assert {"oom_recent", "kv_saturated", "config_headroom_bytes", "kv_usage_ratio",
            "kv_exhaustion_horizon_s"} <= set(used)  # the scan reads rules.py's built-ins


def test_the_tables_keyed_by_metric_resolve():
    """Prometheus's form of each metric, and the engine's per-process metrics."""
    assert set(prom_rules.SERIES) <= set(METRICS)
    assert set(prom_rules.PER_PROCESS) <= set(METRICS)
    assert set(engine._PER_PROCESS_METRICS) <= set(METRICS)
    for rule in builtin_rules(None):
        assert rule.metric in METRICS
        assert rule.gate is None or rule.gate.metric in METRICS
        assert rule.horizon is None or rule.horizon in METRICS


def test_every_row_has_a_unit_a_meaning_inputs_and_a_reader():
    assert len(m.BY_NAME) == len(m.DERIVED)
    assert not set(m.BY_NAME) & set(SAMPLE_COUNTER_FIELDS)
    for row in m.DERIVED:
        assert row.unit in m.UNITS, row.name
        assert row.meaning.strip(), row.name
        assert row.inputs and not row.inputs & m.IN_RAW, row.name
        assert callable(row.read), row.name
        assert (row.words is not None) == (row.unit == m.FLAG), row.name


def test_a_sample_field_is_read_as_it_is_on_any_sample_carrying_it():
    class State:
        fields = {"reserved_bytes": 7.0}

    assert m.inputs_of("reserved_bytes") == m.IN_RAW
    assert m.getter_for("reserved_bytes")(State(), 0.0) == 7.0  # type: ignore[arg-type]
    assert m.inputs_of("kv_saturated") == m.IN_LOAD | m.IN_KV


@pytest.mark.parametrize("metric,value,text", [
    ("risk_level", 2, "critical (risk level 2)"),
    ("leak_detected", 1, "leak"), ("leak_detected", 0, "no leak"),
    ("oom_recent", 1, "OOM in the last 5 min"), ("kv_saturated", 0, "not saturated"),
    ("leak_slope_bytes_per_s", 2**20 / 3600, "1.0 MiB/h"),
    ("leak_slope_ratio_per_h", 0.0125, "1.25 % of the limit per hour"),
    ("kv_orphaned_blocks", 12, "12 blocks"),
    ("headroom_bytes", 3 * 2**30, "3.00 GiB"), ("config_headroom_bytes", -2**20, "-1.0 MiB"),
    ("kv_usage_ratio", 0.5, "50.0 %"), ("time_to_oom_s", 14.1, "14.1 s"),
    ("kv_exhaustion_s", 600, "10.0 min"), ("reserved_bytes", 5 * 2**20, "5.0 MiB"),
    ("num_ooms", 2, "2"), ("a_user_field", 0.25, "0.25"),
])
def test_a_value_is_written_by_its_unit(metric, value, text):
    assert format_value(metric, value) == text


def test_docs_alerts_lists_every_derived_metric():
    doc = (ROOT / "docs" / "alerts.md").read_text()
    table = doc[doc.index("Derived metrics"):doc.index("## Evaluation")]
    assert [row.name for row in m.DERIVED if f"`{row.name}`" not in table] == []
