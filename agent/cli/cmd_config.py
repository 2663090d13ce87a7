"""``vramscope config check [PATH]`` and ``vramscope config show``."""

from __future__ import annotations

import argparse

from vramscope.agent.cli.common import add_config_flag, checked_config


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


def run_check(args: argparse.Namespace) -> int:
    """Every problem of the file, by the agent's own validator (:func:`checked_config`): what
    passes here starts the agent, what fails here stops it."""
    import sys

    problems: list[str] = []
    config, rules, server = checked_config(args.path, problems=problems)
    where = config.source or "no config file found; defaults"
    if problems:
        for problem in problems:
            print(f"vramscope: error: {problem}", file=sys.stderr)
        if len(problems) > 1:
            print(f"{where}: {len(problems)} problems; the agent would refuse to start",
                  file=sys.stderr)
        return 1
    extra = f", {len(rules)} alert rules"
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
