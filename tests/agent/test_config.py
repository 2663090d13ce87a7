"""Config: search order, env overrides, and errors that name the file, key and bad value."""

from __future__ import annotations

import pytest
from vramscope.agent.cli import main
from vramscope.agent.config import load_config, parse_config
from vramscope.agent.errors import ConfigError
from vramscope.agent.settings import SETTINGS_BY_KEY


def write(tmp_path, text: str, name: str = "vramscope.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_without_a_file(tmp_path, monkeypatch):
    monkeypatch.delenv("VRAMSCOPE_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    config = load_config(cwd=tmp_path, environ={})
    assert config.source is None
    assert config["dashboard.host"] == "127.0.0.1"
    assert config["dashboard.port"] == 8321
    assert config["sampling.device_interval_s"] == 0.1
    expected_db = tmp_path / "data" / "vramscope" / "vramscope.db"
    assert config["database.url"] == f"sqlite:///{expected_db}"


def test_search_order_cwd_then_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("VRAMSCOPE_CONFIG", raising=False)
    xdg = tmp_path / "xdg" / "vramscope"
    xdg.mkdir(parents=True)
    (xdg / "vramscope.toml").write_text("[dashboard]\nport = 9001\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    cwd = tmp_path / "work"
    cwd.mkdir()
    assert load_config(cwd=cwd, environ={})["dashboard.port"] == 9001
    (cwd / "vramscope.toml").write_text("[dashboard]\nport = 9002\n")
    assert load_config(cwd=cwd, environ={})["dashboard.port"] == 9002
    explicit = write(tmp_path, "[dashboard]\nport = 9003\n", "explicit.toml")
    assert load_config(str(explicit), cwd=cwd, environ={})["dashboard.port"] == 9003


def test_env_overrides_file(tmp_path):
    path = write(tmp_path, "[dashboard]\nport = 9001\n")
    env = {"VRAMSCOPE_DASHBOARD_PORT": "9100", "VRAMSCOPE_SAMPLING_DEVICE_INTERVAL_S": "0.5"}
    config = load_config(str(path), environ=env)
    assert config["dashboard.port"] == 9100
    assert config["sampling.device_interval_s"] == 0.5


def test_int_accepted_for_float_setting(tmp_path):
    config = load_config(str(write(tmp_path, "[sampling]\ndevice_interval_s = 1\n")), environ={})
    assert config["sampling.device_interval_s"] == 1.0
    assert isinstance(config["sampling.device_interval_s"], float)


BAD = [
    ("[dashboard\nport = 1\n", "not valid TOML"),
    ("[dashbord]\nport = 1\n", "unknown section [dashbord]"),
    ("[dashboard]\nprot = 1\n", "unknown key 'dashboard.prot' (did you mean 'dashboard.port'?)"),
    ("[dashboard]\nport = \"8321\"\n", "dashboard.port must be an integer, got '8321'"),
    ("[dashboard]\nport = true\n", "dashboard.port must be an integer, got True"),
    ("[dashboard]\nport = 70000\n", "dashboard.port = 70000 is out of range; allowed: 1 to 65535"),
    ("[alerts]\nheadroom_warning_ratio = 1.5\n",
     "alerts.headroom_warning_ratio = 1.5 is out of range; allowed: 0 to 1"),
    ("[alerts]\nheadroom_warning_ratio = nan\n", "alerts.headroom_warning_ratio must be a number"),
    ("[database]\nsynchronous = \"OFF\"\n",
     "database.synchronous = 'OFF' is not one of NORMAL, FULL"),
    ("[database]\nurl = \"vramscope.db\"\n",
     "database.url = 'vramscope.db': expected a database URL"),
    ("[agent]\nmetrics_host = \"localhost\"\n",
     "agent.metrics_host = 'localhost': expected an IP address"),
    ("[database]\nintegrity_check_max_cpu_percent = 0\n",  # would divide by zero
     "database.integrity_check_max_cpu_percent = 0.0 is out of range; allowed: 0.01 to 100"),
    ("dashboard = 3\n", "[dashboard] must be a table, got 3"),
    ("[alerts]\nrules = 3\n", "alerts.rules must be an array of tables"),
]


@pytest.mark.parametrize("text,problem", BAD, ids=[b[1][:30] for b in BAD])
def test_bad_file_names_file_key_and_value(tmp_path, text, problem):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), environ={})
    assert str(info.value).startswith(f"{path}: ")
    assert problem in str(info.value)


def test_bad_env_override_names_the_variable():
    with pytest.raises(ConfigError, match=r"\$VRAMSCOPE_DASHBOARD_PORT: dashboard.port must be "
                                          r"an integer, got 'eighty'"):
        parse_config({}, None, {"VRAMSCOPE_DASHBOARD_PORT": "eighty"})


def test_missing_explicit_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.toml: config file not found"):
        load_config(str(tmp_path / "nope.toml"))


def test_config_check_cli(tmp_path, capsys):
    good = write(tmp_path, "[dashboard]\nport = 9000\n")
    assert main(["config", "check", str(good)]) == 0
    assert f"{good}: ok" in capsys.readouterr().out
    bad = write(tmp_path, "[dashboard]\nport = -1\n", "bad.toml")
    assert main(["config", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err == (f"vramscope: error: {bad}: dashboard.port = -1 is out of range; "
                   "allowed: 1 to 65535\n")


def test_replace_validates_flags():
    config = parse_config({}, None, {})
    assert config.replace(dashboard__port=9999)["dashboard.port"] == 9999
    with pytest.raises(ConfigError, match="command line: dashboard.port = 0 is out of range"):
        config.replace(dashboard__port=0)
    assert set(SETTINGS_BY_KEY) == set(config)


def test_analysis_defaults_equal_the_settings_defaults():
    from vramscope.agent.analysis.thresholds import Thresholds

    defaults = parse_config({}, None, {})
    assert all(f"alerts.{name}" in defaults for name in Thresholds._fields)
    assert Thresholds() == Thresholds.from_config(defaults)


@pytest.mark.parametrize("alerts, message", [
    ({"leak_min_span_s": 9000}, "x.toml: alerts.leak_min_span_s = 9000.0 is longer than "
     "alerts.leak_horizon_s = 7200.0; a verdict cannot need more than its span"),
    ({"trend_span_s": 300, "trend_min_span_s": 600}, "x.toml: alerts.trend_min_span_s = 600.0 "
     "is longer than alerts.trend_span_s = 300.0; a verdict cannot need more than its span"),
])
def test_a_minimum_span_longer_than_its_span_is_refused(alerts, message):
    with pytest.raises(ConfigError) as exc:
        parse_config({"alerts": alerts}, "x.toml")
    assert str(exc.value) == message


def test_a_leak_span_under_a_minute_is_refused_in_a_config_file():
    # durations that short exist only for tests through the analysis API
    with pytest.raises(ConfigError,
                       match="alerts.leak_min_span_s = 5.0 is out of range; allowed: 60 to"):
        parse_config({"alerts": {"leak_min_span_s": 5}}, "x.toml")
