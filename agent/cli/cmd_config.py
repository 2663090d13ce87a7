"""``vramscope config check [PATH]`` and ``vramscope config show``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from vramscope.agent.cli.common import add_config_flag

if TYPE_CHECKING:
    from vramscope.agent.alerts.rules import Rule
    from vramscope.agent.config import Config


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("config", help="check or show the configuration")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    check = actions.add_parser("check", help="validate a config file (and its alert rules)")
    check.add_argument("path", nargs="?", help="file to check (default: the search order)")
    check.set_defaults(func=run_check)
    show = actions.add_parser("show", help="print the effective settings and where they came from")
    add_config_flag(show)
    show.set_defaults(func=run_show)


def _load(path: str | None) -> tuple[Config, list[Rule]]:
    from vramscope.agent.config import load_config

    config = load_config(path)
    from vramscope.agent.alerts.rules import parse_rules

    return config, parse_rules(config)


def run_check(args: argparse.Namespace) -> int:
    from vramscope.agent.alerts.config_check import server_from_config

    config, rules = _load(args.path)
    server = server_from_config(config)  # reads the model's config.json; errors name the key
    where = config.source or "no config file found; defaults"
    extra = f", {len(rules)} alert rules" if rules is not None else ""
    if server is not None:
        a = server.admission
        extra += f", [server] {a.max_num_seqs} x {a.max_model_len} tokens of {server.shape.name}"
    print(f"{where}: ok ({len(config)} settings{extra})")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from vramscope.agent.config import load_config

    config = load_config(args.config)
    print(f"# from {config.source or 'defaults'}")
    for key in sorted(config):
        print(f"{key} = {config[key]!r}")
    return 0
