"""Configuration: one TOML file, one declarative table of settings, ``VRAMSCOPE_*`` overrides.

The table is ``settings.py``'s ``SETTINGS``; this module finds the file (the search order:
docs/configuration.md), reads it and the environment (``VRAMSCOPE_<SECTION>_<KEY>`` replaces
the file's value; command-line flags replace both), and validates every value against its row
(:class:`Config`). Alert rules are ``[[alerts.rules]]`` tables; they are kept raw here and
parsed by ``vramscope.agent.alerts.rules`` so that each rule's errors name the rule.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from vramscope.agent.errors import ConfigError
from vramscope.agent.settings import SECTIONS, SETTINGS, SETTINGS_BY_KEY, Setting

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

_RAW_TABLES = {"alerts.rules"}  # arrays of tables validated by their owners
# Sub-tables whose keys are settings of three parts (``sources.prometheus.targets``).
_NESTED_TABLES = frozenset(s.key.rsplit(".", 1)[0] for s in SETTINGS if s.key.count(".") == 2)


class Config(Mapping[str, Any]):
    """Validated settings: ``config["database.url"]``; ``rules`` holds raw ``[[alerts.rules]]``."""

    def __init__(self, values: dict[str, Any], source: str | None,
                 rules: list[dict[str, Any]] | None = None) -> None:
        self._values = values
        self.source = source  # the file it came from, or None for defaults only
        self.rules = rules or []

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def replace(self, **overrides: Any) -> Config:
        """A copy with ``section__name=value`` overrides (from CLI flags), validated."""
        values = dict(self._values)
        for name, value in overrides.items():
            if value is None:
                continue
            key = name.replace("__", ".")
            values[key] = _validate(SETTINGS_BY_KEY[key], value, "command line")
        return Config(values, self.source, self.rules)


def find_config_file(explicit: str | None = None, cwd: Path | None = None) -> Path | None:
    """The config file to use, following the documented search order."""
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"{explicit}: config file not found (given with --config)")
        return path
    env = os.environ.get("VRAMSCOPE_CONFIG")
    if env:
        path = Path(env)
        if not path.is_file():
            raise ConfigError(f"{env}: config file not found (given by $VRAMSCOPE_CONFIG)")
        return path
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    for candidate in ((cwd or Path.cwd()) / "vramscope.toml",
                      Path(xdg) / "vramscope" / "vramscope.toml",
                      Path("/etc/vramscope/vramscope.toml")):
        if candidate.is_file():
            return candidate
    return None


def load_config(explicit: str | None = None, environ: Mapping[str, str] | None = None,
                cwd: Path | None = None, *, problems: list[str] | None = None) -> Config:
    """Find, parse and validate the config; apply ``VRAMSCOPE_*`` overrides. Every problem
    is found, not only the first: raised together as one :class:`ConfigError`, or, given a
    ``problems`` list, added to it (a bad value then reads as its default)."""
    path = find_config_file(explicit, cwd)
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read: {exc}") from None
    return parse_config(raw, str(path) if path else None,
                        os.environ if environ is None else environ, problems=problems)


def parse_config(raw: dict[str, Any], source: str | None,
                 environ: Mapping[str, str] | None = None, *,
                 problems: list[str] | None = None) -> Config:
    """The one validator of settings, for the agent and ``vramscope config check`` alike:
    unknown keys, types, ranges, choices, each setting's own check, then the relations
    between settings. All problems are collected (see :func:`load_config` for where they go)."""
    where = source or "<defaults>"
    found: list[str] = []
    flat, rules = _flatten(raw, where, found)
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        values[setting.key] = _default(setting)
        if setting.key in flat:
            _validated_into(values, setting, flat[setting.key], where, found)
    for setting in SETTINGS:
        env_name = env_var_name(setting.key)
        if environ and env_name in environ:
            try:
                value = _from_env(setting, environ[env_name], env_name)
            except ConfigError as exc:
                found.append(str(exc))
                continue
            _validated_into(values, setting, value, f"${env_name}", found)
    found += relation_problems(values, where)
    if problems is not None:
        problems += found
    elif found:
        raise ConfigError("\n".join(found), problems=found)
    return Config(values, source, rules)


def _default(setting: Setting) -> Any:
    return setting.default() if callable(setting.default) else setting.default


def _validated_into(values: dict[str, Any], setting: Setting, value: Any, where: str,
                    found: list[str]) -> None:
    try:
        values[setting.key] = _validate(setting, value, where)
    except ConfigError as exc:
        found.append(str(exc))


# (a minimum span, the span it is taken from): a verdict cannot need more than its horizon
_SPAN_PAIRS = (("alerts.leak_min_span_s", "alerts.leak_horizon_s"),
               ("alerts.trend_min_span_s", "alerts.trend_span_s"))
# (a warning threshold, its critical one, which way is worse): a warning comes before the
# critical level, so it must be at least as far from trouble
_LEVEL_PAIRS = (("alerts.headroom_warning_ratio", "alerts.headroom_critical_ratio"),
                ("alerts.time_to_oom_warning_s", "alerts.time_to_oom_critical_s"))


def relation_problems(values: Mapping[str, Any], where: str) -> list[str]:
    """Settings that are each in range but contradict one another."""
    found = []
    for least, whole in _SPAN_PAIRS:
        if values[least] > values[whole]:
            found.append(f"{where}: {least} = {values[least]!r} is longer than {whole} = "
                         f"{values[whole]!r}; a verdict cannot need more than its span")
    for warning, critical in _LEVEL_PAIRS:
        if values[warning] < values[critical]:
            found.append(f"{where}: {warning} = {values[warning]!r} is below {critical} = "
                         f"{values[critical]!r}; a warning must come before the critical "
                         f"level, so its threshold must be at least as large")
    return found


def env_var_name(key: str) -> str:
    return "VRAMSCOPE_" + key.replace(".", "_").upper()


def _flatten(raw: dict[str, Any], where: str, found: list[str]
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    flat: dict[str, Any] = {}
    rules: list[dict[str, Any]] = []
    for section, table in raw.items():
        if section not in SECTIONS:
            close = difflib.get_close_matches(section, SECTIONS, n=1)
            found.append(f"{where}: unknown section [{section}]"
                         + (f" (did you mean [{close[0]}]?)" if close else "")
                         + f"; known: {', '.join(sorted(SECTIONS))}")
            continue
        if not isinstance(table, dict):
            found.append(f"{where}: [{section}] must be a table, got {table!r}")
            continue
        for name, value in table.items():
            key = f"{section}.{name}"
            if isinstance(value, dict) and key in _NESTED_TABLES:  # [sources.prometheus]
                flat.update(_flatten({section: {f"{name}.{k}": v for k, v in value.items()}},
                                     where, found)[0])
            elif key in _RAW_TABLES:
                if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
                    found.append(f"{where}: {key} must be an array of tables ([[{key}]]), got "
                                 f"{value!r}")
                else:
                    rules = value
            elif key not in SETTINGS_BY_KEY:
                found.append(f"{where}: unknown key {key!r}" + _did_you_mean(key))
            else:
                flat[key] = value
    return flat, rules


def _did_you_mean(key: str) -> str:
    close = difflib.get_close_matches(key, SETTINGS_BY_KEY, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _from_env(setting: Setting, text: str, env_name: str) -> Any:
    if setting.type is str:
        return text
    if setting.type is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"${env_name}: {setting.key} must be a boolean, got {text!r}")
    try:
        return setting.type(text)
    except ValueError:
        raise ConfigError(f"${env_name}: {setting.key} must be {_type_name(setting.type)}, "
                          f"got {text!r}") from None


def _type_name(t: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}[t]


def _validate(setting: Setting, value: Any, where: str) -> Any:
    key = setting.key
    ok_type = isinstance(value, setting.type) and not (
        setting.type is not bool and isinstance(value, bool))
    if setting.type is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok_type = float(value), True
    if not ok_type:
        raise ConfigError(f"{where}: {key} must be {_type_name(setting.type)}, got {value!r}")
    if setting.type is float and value != value:
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    if setting.min is not None and value < setting.min:
        raise ConfigError(f"{where}: {key} = {value!r} is out of range; allowed: "
                          f"{_range(setting)}")
    if setting.max is not None and value > setting.max:
        raise ConfigError(f"{where}: {key} = {value!r} is out of range; allowed: "
                          f"{_range(setting)}")
    if setting.choices is not None and value not in setting.choices:
        raise ConfigError(f"{where}: {key} = {value!r} is not one of "
                          f"{', '.join(setting.choices)}")
    if setting.check is not None:
        problem = setting.check(value)
        if problem:
            raise ConfigError(f"{where}: {key} = {value!r}: {problem}")
    return value


def _range(setting: Setting) -> str:
    lo = "-inf" if setting.min is None else f"{setting.min:g}"
    hi = "inf" if setting.max is None else f"{setting.max:g}"
    return f"{lo} to {hi}"

