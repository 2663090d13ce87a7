"""Alert rules from the config: built-ins, user rules, and errors that name the rule and key."""

import pytest
from vramscope.agent.alerts.rules import (
    Rule,
    builtin_rules,
    parse_duration,
    parse_rule,
    parse_rules,
)
from vramscope.agent.config import parse_config
from vramscope.agent.errors import ConfigError


def config(rules=None, **alerts):
    raw = {"alerts": dict(alerts)}
    if rules is not None:
        raw["alerts"]["rules"] = rules
    return parse_config(raw, "test.toml", {})


def test_a_full_user_rule():
    r = parse_rule({"name": "reserved_high", "metric": "reserved_bytes", "op": ">=",
                    "threshold": 120e9, "for": "30s", "clear": 110e9, "clear_for": "2m",
                    "severity": "critical", "labels": {"team": "serving"}, "device": 1,
                    "message": "reserved high"})
    assert r == Rule("reserved_high", "reserved_bytes", ">=", 120e9, 30.0, 110e9, 120.0,
                     "critical", {"team": "serving"}, 1, "reserved high")


def test_defaults_of_a_minimal_rule():
    r = parse_rule({"name": "x", "metric": "headroom_ratio", "threshold": 0.1})
    assert (r.op, r.for_s, r.clear, r.clear_for_s, r.severity, r.labels, r.device) == (
        ">", 0.0, None, 0.0, "warning", {}, None)


@pytest.mark.parametrize("text, seconds", [
    (0, 0.0), (15, 15.0), (2.5, 2.5), ("500ms", 0.5), ("30s", 30.0), ("5m", 300.0),
    ("1.5h", 5400.0), ("1d", 86400.0), (" 7 ", 7.0),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


BAD = [
    ({"metric": "reserved_bytes", "threshold": 1}, "alert rule #1: missing required key 'name'"),
    ({"name": "a", "threshold": 1}, "alert rule 'a': missing required key 'metric'"),
    ({"name": "a", "metric": "reserved"}, "alert rule 'a': metric = 'reserved' is not a known"),
    ({"name": "a", "metric": "reserved_bytes"}, "alert rule 'a': missing required key 'threshold'"),
    ({"name": "a", "metric": "reserved_bytes", "threshold": "1"},
     "alert rule 'a': threshold must be a number, got '1'"),
    ({"name": "a", "metric": "reserved_bytes", "threshold": 1, "op": "=>"},
     "alert rule 'a': op = '=>' is not one of"),
    ({"name": "a", "metric": "reserved_bytes", "threshold": 1, "for": "5 minutes"},
     "alert rule 'a': for must be a duration"),
    ({"name": "a", "metric": "reserved_bytes", "threshold": 1, "clear_for": -1},
     "alert rule 'a': clear_for must be a duration"),
    ({"name": "a", "metric": "reserved_bytes", "threshold": 10, "clear": 11},
     "alert rule 'a': clear = 11 must not be above threshold = 10 for op '>'"),
    ({"name": "a", "metric": "headroom_ratio", "op": "<", "threshold": 0.1, "clear": 0.05},
     "alert rule 'a': clear = 0.05 must not be below threshold = 0.1 for op '<'"),
    ({"name": "a", "metric": "risk_level", "op": "==", "threshold": 2, "clear": 1},
     "alert rule 'a': clear is only allowed with"),
    ({"name": "a", "metric": "reserved_bytes", "threshold": 1, "severity": "page"},
     "alert rule 'a': severity = 'page' is not one of info, warning, critical"),
    ({"name": "a", "metric": "reserved_bytes", "threshold": 1, "labels": {"team": 3}},
     "alert rule 'a': labels must be a table of strings"),
    ({"name": "a", "metric": "reserved_bytes", "threshold": 1, "device": -1},
     "alert rule 'a': device must be a device index >= 0, got -1"),
    ({"name": "a", "metric": "reserved_bytes", "threshold": 1, "treshold": 2},
     "alert rule 'a': unknown key 'treshold'"),
]


@pytest.mark.parametrize("raw, message", BAD, ids=[m for _, m in BAD])
def test_a_bad_rule_names_the_rule_and_the_key(raw, message):
    with pytest.raises(ConfigError) as exc:
        parse_rules(config([raw]))
    assert str(exc.value).startswith("test.toml: " + message)


def test_duplicate_names_are_an_error():
    rule = {"name": "a", "metric": "reserved_bytes", "threshold": 1}
    with pytest.raises(ConfigError,
                       match="^test.toml: alert rule 'a': name is used by more than one rule"):
        parse_rules(config([rule, rule]))


def test_builtins_take_thresholds_from_the_settings():
    rules = {r.name: r for r in builtin_rules(config(kv_exhaustion_warning_s=90.0))}
    assert set(rules) == {"oom_risk", "oom_risk_critical", "memory_leak", "kv_exhaustion", "oom",
                          "kv_saturation"}
    assert (rules["kv_exhaustion"].metric, rules["kv_exhaustion"].op,
            rules["kv_exhaustion"].threshold) == ("kv_exhaustion_s", "<", 90.0)
    assert rules["oom_risk_critical"].severity == "critical"


def test_a_user_rule_replaces_the_builtin_of_the_same_name():
    rules = parse_rules(config([{"name": "memory_leak", "metric": "leak_slope_ratio_per_h",
                                 "threshold": 0.01, "severity": "critical"}]))
    leak = [r for r in rules if r.name == "memory_leak"]
    assert len(leak) == 1 and leak[0].severity == "critical" and not leak[0].builtin
    assert len(rules) == 6


@pytest.mark.parametrize("op, value, breached, cleared", [
    (">", 11, True, False), (">", 10, False, False), (">", 8, False, True),
    (">", None, False, True),
])
def test_hysteresis(op, value, breached, cleared):
    r = Rule("r", "reserved_bytes", op, 10, clear=9)
    assert (r.breached(value), r.cleared(value)) == (breached, cleared)
