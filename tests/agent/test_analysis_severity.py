"""The one severity scale: its order, its exported numbers, and a bad value refused by name."""

import ast
import re
from pathlib import Path

import pytest
from vramscope.agent.analysis.severity import (
    ALERT_SEVERITIES,
    LEVELS,
    NO_LEVEL,
    Severity,
    rank,
    worst,
)


def test_the_order_and_the_numbers_the_metrics_export():
    assert Severity.OK < Severity.WARNING < Severity.CRITICAL
    # the risk_level rule metric and the Prometheus risk series say 0 ok, 1 warning, 2 critical
    assert [(s.label, int(s)) for s in Severity] == [("ok", 0), ("warning", 1), ("critical", 2)]
    assert LEVELS == ("ok", "warning", "critical")
    assert ALERT_SEVERITIES == ("info", "warning", "critical")


def test_every_level_and_alert_severity_parses_back_to_its_place():
    assert [Severity.parse(n) for n in LEVELS] == list(Severity)
    assert Severity.parse(Severity.WARNING) is Severity.WARNING
    # an info alert tells, it does not raise the level: it ranks with ok
    assert [Severity.parse(n) for n in ALERT_SEVERITIES] == [
        Severity.OK, Severity.WARNING, Severity.CRITICAL]


def test_rank_puts_no_level_yet_below_ok():
    assert [rank(n) for n in (NO_LEVEL, "ok", "info", "warning", "critical")] == [-1, 0, 0, 1, 2]
    assert sorted(["critical", "", "ok", "warning"], key=rank) == ["", "ok", "warning", "critical"]


def test_worst_of_several_and_of_none():
    assert worst(["info", "critical", "warning"]) is Severity.CRITICAL
    assert worst(["ok", NO_LEVEL, "warning"]) is Severity.WARNING
    assert worst(["info"]) is Severity.OK
    assert worst([]) is Severity.OK
    assert worst([NO_LEVEL]) is Severity.OK


@pytest.mark.parametrize("bad", ["page", "Critical", "warn", None, 2])
def test_a_bad_value_is_refused_naming_it_and_where(bad):
    with pytest.raises(ValueError) as err:
        Severity.parse(bad, "alert kv_pressure")
    assert str(err.value) == (f"alert kv_pressure: {bad!r} is not a severity "
                              "(one of ok, info, warning, critical)")


def test_rank_and_worst_refuse_a_bad_value_too():
    with pytest.raises(ValueError, match=r"^risk level: 'sever' is not a severity"):
        rank("sever", "risk level")
    with pytest.raises(ValueError, match=r"^severity: 'urgent' is not a severity"):
        worst(["ok", "urgent"])


ROOT = Path(__file__).resolve().parents[2]
NAMES = {"ok", "info", "warning", "critical"}


def _literal(node: ast.expr) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _tables_of_severities(path: Path) -> list[str]:
    """Dict literals mapping severity names to numbers, and literal sequences listing the
    scale in full (a name with its neighbours on both sides), in one Python file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            numbers = all(isinstance(_literal(v), int) for v in node.values)
            if len(keys & NAMES) >= 2 and numbers:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        elif isinstance(node, (ast.Tuple, ast.List)):
            items = {e.value for e in node.elts if isinstance(e, ast.Constant)}
            if {"warning", "critical"} <= items and items & {"ok", "info"}:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_other_module_writes_its_own_severity_order():
    """The order is severity.py's alone: a second table (four disagreed at their edges before)
    is found here, in the Python of the agent and the dashboard and in the pages' script."""
    own = ROOT / "agent" / "analysis" / "severity.py"
    found = [place for folder in ("agent", "dashboard", "hooks")
             for path in sorted((ROOT / folder).rglob("*.py")) if path != own
             for place in _tables_of_severities(path)]
    script = (ROOT / "dashboard" / "static" / "app.js").read_text(encoding="utf-8")
    found += [f"dashboard/static/app.js: {m.group(0)}"
              for m in re.finditer(r"\b(ok|warning|critical)\s*:\s*\d", script)]
    assert found == []
