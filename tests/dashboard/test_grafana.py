"""The Grafana dashboard in ``docs/grafana/vramscope.json`` queries only what vramscope exports.

Every ``vramscope_*`` series a panel or a variable queries must appear on a real ``/metrics``
scrape (of a scripted store); every PromQL expression, with Grafana's variables filled in,
must pass ``promtool check rules`` as a recording rule; and the metric names must be the ones
``docs/metrics.md`` documents.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.exported_metrics import exported_series

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "vramscope.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"
SERIES = re.compile(r"\bvramscope_[a-z_]+\b")
LABEL_NAMES = {"vramscope_rule"}  # a label of the generated alerts, not a series
# Grafana's own variables, filled in the way Grafana would for a single selection.
GRAFANA_VARS = {"$__rate_interval": "5m", "$host": ".*", "$device": ".*"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"]
              if v["type"] == "query"]
    return exprs


def promql(expr: str) -> str:
    for name, value in GRAFANA_VARS.items():
        expr = expr.replace(name, value)
    return expr


def test_every_queried_metric_is_exported(dashboard, store):
    exported = set(exported_series(store))
    queried = {name for e in expressions(dashboard) for name in SERIES.findall(e)}
    assert len(queried) >= 15
    assert sorted(queried - exported) == []


def test_every_exported_metric_is_documented(store):
    gone = {"vramscope_kv_blocks_total"}  # documented as renamed, no longer exported
    documented = set(SERIES.findall(METRICS_DOC.read_text())) - LABEL_NAMES - gone
    exported = set(exported_series(store))
    assert sorted(exported - documented) == []
    # ...and the doc names nothing that is not exported (families may add _total, _created).
    assert sorted(documented - exported) == []


def test_panels_are_well_formed(dashboard):
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "host", "device"}
    for p in dashboard["panels"]:
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]), p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        for t in p["targets"]:
            used = set(re.findall(r"\$(\w+)", t["expr"])) - {"__rate_interval"}
            assert used <= variables, (p["title"], used)
    units = {p["title"]: p["fieldConfig"]["defaults"].get("unit") for p in dashboard["panels"]
             if p["type"] != "row"}
    assert units["GPU memory"] == "bytes"


def test_fleet_panel_puts_the_riskiest_devices_first(dashboard):
    panel = next(p for p in dashboard["panels"] if p["title"] == "Riskiest devices")
    assert panel["targets"][0]["expr"].startswith("sort_desc(vramscope_risk_level{")


@pytest.mark.usefixtures("promtool")
def test_every_expression_is_valid_promql(dashboard, tmp_path):
    exprs = [promql(e) for e in expressions(dashboard) if not e.startswith("label_values(")]
    # label_values() is Grafana's, not PromQL: check its selector instead.
    exprs += [promql(re.match(r"label_values\((.*), \w+\)$", e).group(1))
              for e in expressions(dashboard) if e.startswith("label_values(")]
    lines = ["groups:", "  - name: grafana", "    rules:"]
    for i, e in enumerate(exprs):
        lines += [f"      - record: grafana_panel_{i}", f"        expr: {json.dumps(e)}"]
    path = tmp_path / "panels.yml"
    path.write_text("\n".join(lines) + "\n")
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout
