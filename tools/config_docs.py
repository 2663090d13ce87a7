"""Render ``docs/configuration.md``'s settings reference from ``SETTINGS``.

``python -m tools.config_docs > docs/configuration.md`` regenerates it; ``tests/test_docs.py``
fails when a setting is missing from the docs, so the table and the docs cannot drift apart.
"""

from __future__ import annotations

from vramscope.agent.config import env_var_name
from vramscope.agent.settings import SETTINGS, Setting

HEADER = """# Configuration

vramscope reads one TOML file. The first that exists, in this order, is used:

1. `--config PATH` on the command line (an error if it does not exist),
2. `$VRAMSCOPE_CONFIG` (an error if it does not exist),
3. `./vramscope.toml`,
4. `$XDG_CONFIG_HOME/vramscope/vramscope.toml` (default `~/.config/vramscope/vramscope.toml`),
5. `/etc/vramscope/vramscope.toml`.

No file is fine: every setting has a default. Each setting can be overridden by an environment
variable, `VRAMSCOPE_<SECTION>_<KEY>` (listed below), which wins over the file; command-line flags
such as `--db` win over both.

A bad file stops vramscope with an error that names the file, the key and the bad value: not
valid TOML, an unknown section or key (with a "did you mean"), a wrong type, a value out of
range, or settings that contradict one another (a warning threshold below its critical one:
`alerts.headroom_warning_ratio` < `alerts.headroom_critical_ratio`,
`alerts.time_to_oom_warning_s` < `alerts.time_to_oom_critical_s`; a minimum span longer than
its span). Every problem of the file is reported, one line each, not only the first.
`vramscope config check [PATH]` validates a file without starting anything, with the agent's
own validator (the settings, the alert rules, the `[server]` section): what it passes, the
agent starts with; what it refuses, the agent refuses with the same lines (exit 1).
`vramscope config show` prints the effective settings.

```toml
[database]
url = "sqlite:////var/lib/vramscope/vramscope.db"

[dashboard]
host = "127.0.0.1"
port = 8321

[alerts]
headroom_warning_ratio = 0.05
```

Alert rules of your own are `[[alerts.rules]]` tables; see [alerts.md](alerts.md).

## Settings

| key | type | default | environment variable | description |
|---|---|---|---|---|
"""


def render() -> str:
    rows = []
    for s in SETTINGS:
        limits = []
        if s.min is not None or s.max is not None:
            limits.append(f"range {s.min if s.min is not None else '-inf':g}"
                          f"..{s.max if s.max is not None else float('inf'):g}")
        if s.choices:
            limits.append("one of " + ", ".join(f"`{c}`" for c in s.choices))
        extra = f" ({'; '.join(limits)})" if limits else ""
        rows.append(f"| `{s.key}` | {s.type.__name__} | `{default_text(s)}` | "
                    f"`{env_var_name(s.key)}` | {s.help}{extra} |")
    return HEADER + "\n".join(rows) + "\n"


def default_text(setting: Setting) -> str:
    """The default as the docs show it (environment-dependent ones described, not resolved)."""
    if callable(setting.default):
        return "(see description)"
    return repr(setting.default) if setting.type is str else str(setting.default)


if __name__ == "__main__":
    print(render(), end="")
