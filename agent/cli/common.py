"""Helpers shared by subcommands: config loading with flag overrides, opening the store."""

from __future__ import annotations

import argparse

from vramscope.agent.config import Config, load_config


def add_config_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="PATH", help="config file (default: search order in "
                   "docs/configuration.md)")


def add_db_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL", dest="db_url",
                   help="database URL (default: database.url from the config)")


def config_from_args(args: argparse.Namespace) -> Config:
    config = load_config(getattr(args, "config", None))
    db_url = getattr(args, "db_url", None)
    return config.replace(database__url=db_url) if db_url else config


def open_store(args: argparse.Namespace, config: Config | None = None):
    from vramscope.agent.store import Store

    config = config or config_from_args(args)
    return Store.open(config["database.url"], synchronous=config["database.synchronous"],
                      host_name=config["agent.host_name"] or None)
