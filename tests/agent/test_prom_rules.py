"""``vramscope export prometheus-rules``: the config's alert rules as a Prometheus rules file.

Checked three ways: exact rule names and PromQL for a scripted config, ``promtool check rules``
(Debian's ``prometheus`` package) and ``promtool test rules``, which evaluates the generated
rules over synthetic series — the ``for``, the hysteresis (``clear``) and ``keep_firing_for``
(``clear_for``) are seen firing and resolving at the expected minutes. Every series the rules
query is scraped from a real dashboard ``/metrics``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml
from vramscope.agent.alerts.prom_rules import (
    SERIES,
    alert_name,
    duration,
    render_rules,
)
from vramscope.agent.alerts.rules import METRICS
from vramscope.agent.config import parse_config

from tests.support.exported_metrics import exported_series

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

needs_promtool = pytest.mark.usefixtures("promtool")  # skipped without it, failed under CI

SCRIPTED_TOML = """
[alerts]
kv_exhaustion_warning_s = 120.0

[[alerts.rules]]
name = "reserved-high"
metric = "reserved_bytes"
op = ">"
threshold = 100
clear = 80
for = "1m"
clear_for = "2m"
severity = "critical"
device = 0
labels = { team = "serving" }
message = "reserved above {{100}} bytes"

[[alerts.rules]]
name = "oom"
metric = "num_ooms"
op = ">="
threshold = 1
severity = "info"

[[alerts.rules]]
name = "fragmented"
metric = "external_fragmentation_ratio"
op = ">="
threshold = 0.35
for = 90

[[alerts.rules]]
name = "slow-leak"
metric = "leak_slope_ratio_per_h"
threshold = 0.01
"""


def scripted_config():
    return parse_config(tomllib.loads(SCRIPTED_TOML), "scripted.toml", {})


def rules_of(text: str) -> dict[str, dict]:
    doc = yaml.safe_load(text)
    assert [g["name"] for g in doc["groups"]] == ["vramscope"]
    return {r["alert"]: r for r in doc["groups"][0]["rules"]}


# each server's pool against its own size: the fullest pool's share, and the time to
# exhaustion of that pool (issue 47: a full 63-block pool beside a 16,384-block one)
KV_SHARE = "vramscope_process_kv_blocks_used / vramscope_process_kv_blocks_capacity"
KV_USAGE = f"max by (host, device) ({KV_SHARE})"
KV_EXPR = (
    "(min by (host, device) (((vramscope_process_kv_blocks_capacity"
    " - vramscope_process_kv_blocks_used) / (deriv(vramscope_process_kv_blocks_used[5m]) > 0))"
    f" and on(host, device, process, pid) ({KV_SHARE} == on(host, device) group_left"
    f" {KV_USAGE})) < 60)"
    f" and on(host, device) ({KV_USAGE} >= 0.8)"
    f" or (({KV_USAGE} >= 0.8)"
    ' and on(host, device) ALERTS{alertname="VramscopeKvExhaustion", alertstate="firing"})')


def test_default_rules_exact():
    text = render_rules(parse_config({}, None, {}))
    rules = rules_of(text)
    assert {name: r["expr"] for name, r in rules.items()} == {
        "VramscopeOomRisk": "vramscope_risk_level >= 1",
        "VramscopeOomRiskCritical": "vramscope_risk_level >= 2",
        # Fires while growing toward the end of a pool at least 80 % full; stays while it is.
        "VramscopeKvExhaustion": KV_EXPR,
        "VramscopeOom": "(increase(vramscope_ooms_total[5m]) > bool 0) >= 1",
        # the stored leak verdicts (1 leak, 0 no leak, -1 not enough data), one per process
        "VramscopeMemoryLeak": "(vramscope_process_leak_state == bool 1) >= 1",
        "VramscopeKvSaturation": "vramscope_kv_saturated >= 1",
    }
    assert (rules["VramscopeOomRisk"]["for"], rules["VramscopeOomRisk"]["keep_firing_for"]) \
        == ("15s", "30m")  # alerts.risk_for_s; resolves after 30 min (rules.RISK_HOLD_S)
    assert "for" not in rules["VramscopeOomRiskCritical"]
    assert rules["VramscopeKvExhaustion"]["for"] == "5s"
    assert rules["VramscopeKvExhaustion"]["keep_firing_for"] == "30s"
    assert rules["VramscopeOomRiskCritical"]["labels"] == {
        "severity": "critical", "vramscope_rule": "oom_risk_critical"}
    # The agent's "fire at once when critical" cannot be said in the same rule: a comment.
    assert ("      # The agent fires this at once when risk_level >= 2; Prometheus waits the "
            "`for` at every level.\n      - alert: \"VramscopeOomRisk\"") in text
    # Every built-in is exported: nothing left out (the leak rule was, issue 47).
    assert "# Not exported" not in text


def test_settings_reach_the_rules():
    config = parse_config({"alerts": {"risk_for_s": 30.0, "kv_exhaustion_warning_s": 90.0,
                                      "kv_exhaustion_min_usage_ratio": 0.9}}, None, {})
    rules = rules_of(render_rules(config))
    assert rules["VramscopeOomRisk"]["for"] == "30s"
    assert rules["VramscopeKvExhaustion"]["expr"] == (
        KV_EXPR.replace("< 60", "< 90").replace(">= 0.8", ">= 0.9"))


def test_scripted_rules_exact():
    rules = rules_of(render_rules(scripted_config()))
    assert list(rules) == ["VramscopeOomRisk", "VramscopeOomRiskCritical", "VramscopeMemoryLeak",
                           "VramscopeKvExhaustion", "VramscopeKvSaturation",
                           "VramscopeReservedHigh", "VramscopeOom", "VramscopeFragmented"]
    high = rules["VramscopeReservedHigh"]
    assert high["expr"] == (
        'vramscope_reserved_bytes{device="0"} > 100 or ((vramscope_reserved_bytes{device="0"} > 80)'
        ' and on(host, device) ALERTS{alertname="VramscopeReservedHigh", alertstate="firing"})')
    assert (high["for"], high["keep_firing_for"]) == ("1m", "2m")
    assert high["labels"] == {"severity": "critical", "team": "serving",
                              "vramscope_rule": "reserved-high"}
    # The user's "{{" is text, not a template action.
    assert high["annotations"]["summary"] == 'reserved above {{ "{{" }}100}} bytes'
    # A user rule named like a built-in replaces it; the config's KV threshold is used.
    assert rules["VramscopeOom"]["expr"] == "vramscope_ooms_total >= 1"
    assert rules["VramscopeOom"]["labels"]["severity"] == "info"
    assert rules["VramscopeKvExhaustion"]["expr"] == KV_EXPR.replace("< 60", "< 120")
    assert rules["VramscopeFragmented"]["expr"] == (
        "(1 - vramscope_largest_free_block_bytes / (vramscope_reserved_bytes"
        " - vramscope_allocated_bytes)) >= 0.35")
    assert rules["VramscopeFragmented"]["for"] == "90s"


def test_left_out_rules_are_listed():
    text = render_rules(scripted_config())
    tail = text[text.index("# Not exported"):].splitlines()
    assert tail[1:] == ["#   slow-leak (leak_slope_ratio_per_h)"]


def test_names_and_durations():
    assert alert_name("oom_risk") == "VramscopeOomRisk"
    assert alert_name("reserved-high.gpu0") == "VramscopeReservedHighGpu0"
    assert [duration(s) for s in (5, 30, 90, 300, 3600, 0.5, 1.25)] == [
        "5s", "30s", "90s", "5m", "1h", "500ms", "1250ms"]


def test_every_queried_series_is_exported(store):
    queried = {name for expr in SERIES.values()
               for name in re.findall(r"\bvramscope_[a-z_]+", expr)}
    assert len(queried) > 5
    assert sorted(queried - set(exported_series(store))) == []


def test_metrics_without_a_series_are_exactly_the_agent_only_ones():
    """When /metrics grows one of these, map it in SERIES and this list shrinks."""
    assert sorted(set(METRICS) - set(SERIES)) == sorted([
        "active_bytes", "requested_bytes", "headroom_bytes", "headroom_ratio", "time_to_oom_s",
        "leak_slope_ratio_per_h", "kv_exhaustion_horizon_s"])


@needs_promtool
@pytest.mark.parametrize("config", ["defaults", "scripted"])
def test_promtool_check_rules(tmp_path, config):
    cfg = parse_config({}, None, {}) if config == "defaults" else scripted_config()
    path = tmp_path / "rules.yml"
    path.write_text(render_rules(cfg))
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules_of(path.read_text()))} rules found" in done.stdout


def _alert(device: str, value: int) -> dict:
    return {"exp_labels": {"host": "a", "device": device, "severity": "critical",
                           "team": "serving", "vramscope_rule": "reserved-high"},
            "exp_annotations": {
                "summary": "reserved above {{100}} bytes",
                "description": f"reserved above {{{{100}}}} bytes on host a GPU {device}: "
                               f"value {value} (vramscope rule reserved-high: "
                               f"reserved_bytes > 100)"}}


@needs_promtool
def test_promtool_evaluates_for_hysteresis_and_keep_firing(tmp_path):
    """Minute by minute: 50 120 120 90 90 90 70 70 70 70 on device 0 (threshold 100, clear 80,
    for 1m, clear_for 2m); device 1 stays at 500 but the rule is for device 0 only."""
    (tmp_path / "rules.yml").write_text(render_rules(scripted_config()))
    at = lambda minute, alerts: {"eval_time": f"{minute}m", "alertname": "VramscopeReservedHigh",
                                 "exp_alerts": alerts}
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": 'vramscope_reserved_bytes{host="a",device="0"}',
             "values": "50 120 120 90 90 90 70 70 70 70"},
            {"series": 'vramscope_reserved_bytes{host="a",device="1"}', "values": "500x9"}],
        "alert_rule_test": [
            at(1, []),  # above the threshold, pending for 1m
            at(2, [_alert("0", 120)]),  # fired
            at(5, [_alert("0", 90)]),  # below 100 but above clear=80: still firing
            at(7, [_alert("0", 90)]),  # below clear since 6m: kept by keep_firing_for 2m
            at(8, []),  # resolved
        ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    done = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_evaluates_the_kv_gate(tmp_path):
    """Blocks used per minute, of 100: 20 40 60 85 95 95 95 95 95 50 50 50. At 3 min the
    5-minute growth (21.5 blocks/min) runs the pool out in 42 s (< 60) while it is 85 % full:
    pending, firing at 4 min (15 s left). Growth then stops, so the time to exhaustion is
    gone, but the pool stays 95 % full: the gate keeps the alert. At 9 min usage drops to 50 %;
    keep_firing_for holds it one more evaluation; resolved at 10 min. A second server's pool
    of 16,384 blocks on the same GPU, 100 used throughout, changes nothing: each pool is read
    against its own size (the device's sums, at most 195 of 16,484 blocks, never fired)."""
    (tmp_path / "rules.yml").write_text(render_rules(parse_config({}, None, {})))
    labels = {"host": "a", "device": "0", "severity": "warning", "vramscope_rule": "kv_exhaustion"}

    def firing(value: str) -> list[dict]:
        return [{"exp_labels": labels, "exp_annotations": {
            "summary": "KV pool runs out of blocks soon",
            "description": f"KV pool runs out of blocks soon on host a GPU 0: value {value} "
                           "(vramscope rule kv_exhaustion: kv_exhaustion_s < 60 while "
                           "kv_usage_ratio >= 0.8)"}}]

    small = 'host="a",device="0",process="vllm engine core (port 8000)",pid="4100"'
    big = 'host="a",device="0",process="vllm engine core (port 8001)",pid="4200"'
    at = lambda minute, alerts: {"eval_time": f"{minute}m", "alertname": "VramscopeKvExhaustion",
                                 "exp_alerts": alerts}
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f'vramscope_process_kv_blocks_used{{{small}}}',
             "values": "20 40 60 85 95 95 95 95 95 50 50 50"},
            {"series": f'vramscope_process_kv_blocks_capacity{{{small}}}', "values": "100x11"},
            {"series": f'vramscope_process_kv_blocks_used{{{big}}}', "values": "100x11"},
            {"series": f'vramscope_process_kv_blocks_capacity{{{big}}}',
             "values": "16384x11"}],
        "alert_rule_test": [at(2, []), at(3, []), at(4, firing("15.384615384615383")),
                            at(8, firing("0.95")), at(9, firing("0.95")), at(10, [])]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    done = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_cli_export_writes_the_same_file(tmp_path):
    from vramscope.agent.cli import main

    cfg = tmp_path / "vramscope.toml"
    cfg.write_text(SCRIPTED_TOML)
    out = tmp_path / "rules.yml"
    assert main(["export", "prometheus-rules", "--config", str(cfg), "-o", str(out)]) == 0
    expected = render_rules(parse_config(tomllib.loads(SCRIPTED_TOML), str(cfg), {}))
    assert out.read_text() == expected
    assert f"from {cfg}." in expected


def test_docs_list_every_mapping():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    missing = [m for m, e in SERIES.items() if f"| `{m}` | `{e.format(sel='')}` |" not in doc]
    assert missing == []


def test_cli_export_names_a_bad_rule_and_writes_nothing(tmp_path, capsys):
    from vramscope.agent.cli import main

    cfg = tmp_path / "vramscope.toml"
    cfg.write_text('[[alerts.rules]]\nname = "typo"\nmetric = "reserved_byte"\nthreshold = 1\n')
    out = tmp_path / "rules.yml"
    assert main(["export", "prometheus-rules", "--config", str(cfg), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "alert rule 'typo'" in err and "'reserved_byte'" in err and str(cfg) in err
    assert not out.exists() or out.read_text() == ""


def server_config(tmp_path):
    """A config with a [server] section (Llama-3-8B's shape): config_oom is a built-in too."""
    from tests.support.exported_metrics import SERVER_MODEL

    model = tmp_path / "config.json"
    model.write_text(json.dumps(SERVER_MODEL))
    return parse_config({"server": {"model": str(model), "max_num_seqs": 4}}, "s.toml", {})


def test_every_built_in_rule_is_exported(tmp_path):
    """The built-ins with a [server] section (all of them: config_oom too) each become one
    Prometheus alert, and nothing is left out."""
    from vramscope.agent.alerts.rules import builtin_rules

    config = server_config(tmp_path)
    text = render_rules(config)
    rules = rules_of(text)
    assert sorted(r["labels"]["vramscope_rule"] for r in rules.values()) == sorted(
        r.name for r in builtin_rules(config))
    assert rules["VramscopeConfigOom"]["expr"] == "vramscope_config_headroom_bytes < 0"
    assert "# Not exported" not in text


@needs_promtool
def test_promtool_evaluates_the_leak_and_config_rules(tmp_path):
    """Minute by minute on GPU 0: the leaky process's stored verdict -1 -1 0 1 1 0 (not enough
    data, no leak, leak, no leak), the healthy one's 0 throughout; the [server] check's
    headroom 2 GiB, then -1 GiB once a process cap lowers the limit. The leak alert names the
    process and its pid; config_oom fires at once."""
    (tmp_path / "rules.yml").write_text(render_rules(server_config(tmp_path)))
    leak = {"host": "a", "device": "0", "process": "leaky", "pid": "42", "severity": "warning",
            "vramscope_rule": "memory_leak"}
    leak_alert = [{"exp_labels": leak, "exp_annotations": {
        "summary": "idle floor rising after the warm-up",
        "description": "idle floor rising after the warm-up on host a GPU 0 process leaky "
                       "(pid 42): value 1 (vramscope rule memory_leak: leak_detected >= 1)"}}]
    oom = {"host": "a", "device": "0", "severity": "warning", "vramscope_rule": "config_oom"}
    oom_alert = [{"exp_labels": oom, "exp_annotations": {
        "summary": "the worst request the server admits cannot fit under the limit",
        "description": "the worst request the server admits cannot fit under the limit on host "
                       "a GPU 0: value -1.073741824e+09 (vramscope rule config_oom: "
                       "config_headroom_bytes < 0)"}}]
    at = lambda minute, name, alerts: {"eval_time": f"{minute}m", "alertname": name,
                                       "exp_alerts": alerts}
    state = 'vramscope_process_leak_state{{host="a",device="0",process="{}",pid="{}"}}'
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": state.format("leaky", 42), "values": "-1 -1 0 1 1 0"},
            {"series": state.format("healthy", 43), "values": "0x5"},
            {"series": 'vramscope_config_headroom_bytes{host="a",device="0"}',
             "values": "2147483648 2147483648 -1073741824 -1073741824"}],
        "alert_rule_test": [
            at(1, "VramscopeMemoryLeak", []),  # not enough data is not a leak
            at(2, "VramscopeMemoryLeak", []),
            at(3, "VramscopeMemoryLeak", leak_alert),  # fires at once: no `for`
            at(4, "VramscopeMemoryLeak", leak_alert),
            at(5, "VramscopeMemoryLeak", []),
            at(1, "VramscopeConfigOom", []),
            at(2, "VramscopeConfigOom", oom_alert),
        ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    done = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
