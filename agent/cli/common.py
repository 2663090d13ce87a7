"""Helpers shared by subcommands: config loading with flag overrides, opening the store."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from vramscope.agent.config import Config, load_config

if TYPE_CHECKING:
    from vramscope.agent.store import Store


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


def open_store(args: argparse.Namespace, config: Config | None = None, *,
               reading: str | None = None) -> Store:
    """The store of ``--db`` (or ``database.url``). ``reading`` names a command that only
    reads: it refuses a database that does not exist instead of creating it."""
    from vramscope.agent.store import Store

    config = config or config_from_args(args)
    if reading:
        require_existing_database(config["database.url"], reading)
    return Store.open(config["database.url"], synchronous=config["database.synchronous"],
                      host_name=config["agent.host_name"] or None)


def require_existing_database(url: str, command: str) -> None:
    """Raise when ``url`` is a SQLite file that does not exist: ``vramscope <command>`` reads,
    and a mistyped path must not become a new, empty database that looks healthy."""
    from vramscope.agent.errors import StoreError
    from vramscope.agent.store.exists import missing_sqlite_file

    missing = missing_sqlite_file(url)
    if missing is not None:
        raise StoreError(
            f"database {missing} does not exist (URL {url}); 'vramscope {command}' only reads "
            f"an existing database. Check the path, or create one: 'vramscope agent' records "
            f"into it, 'vramscope import FILE --db URL' loads a trace, 'vramscope db upgrade "
            f"--db URL' creates an empty one")
