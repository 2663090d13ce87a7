"""Helpers shared by subcommands: config loading with flag overrides, opening the store."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, NamedTuple

from vramscope.agent.config import Config, load_config

if TYPE_CHECKING:
    from vramscope.agent.alerts.config_check import ServerLimits
    from vramscope.agent.alerts.rules import Rule
    from vramscope.agent.store import Store


def add_config_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="PATH", help="config file (default: search order in "
                   "docs/configuration.md)")


DB_HELP = "database URL, or the path of a SQLite file"


def add_db_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL", dest="db_url", type=url_or_path,
                   help=f"{DB_HELP} (default: database.url from the config)")


def url_or_path(text: str) -> str:
    """``--db`` as every command takes it: a SQLAlchemy URL as given, or a plain path (what
    people type: ``--db /x/demo.db``, ``--db demo.db``) as the URL of that SQLite file,
    made absolute so that every message names the file itself."""
    import os

    if "://" in text:
        return text
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a database URL or a file path, got ''")
    return f"sqlite:///{os.path.abspath(os.path.expanduser(text))}"


def shown_db(url: str) -> str:
    """A database as messages name it: a SQLite file by its path (what ``--db`` takes and
    people type), any other URL with its password hidden."""
    import re

    from vramscope.agent.store.exists import sqlite_file

    file = sqlite_file(url)
    if file is not None and file.is_absolute():
        return str(file)
    # user:password@ as SQLAlchemy's safe URL shows it (the store module alone imports it)
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def config_from_args(args: argparse.Namespace) -> Config:
    config = load_config(getattr(args, "config", None))
    db_url = getattr(args, "db_url", None)
    return config.replace(database__url=db_url) if db_url else config


class CheckedConfig(NamedTuple):
    config: Config
    rules: list[Rule]
    server: ServerLimits | None


def checked_config(path: str | None, *, problems: list[str] | None = None) -> CheckedConfig:
    """The config validated as the agent needs it, by the one validator that ``vramscope
    config check`` runs too: every setting (types, ranges, each one's check, the relations
    between them), every ``[[alerts.rules]]`` table, the ``[server]`` section. Every problem
    is found: raised together as one :class:`ConfigError`, or added to ``problems``."""
    from vramscope.agent.alerts.config_check import server_from_config
    from vramscope.agent.alerts.rules import parse_rule, parse_rules
    from vramscope.agent.errors import ConfigError, VramscopeError

    found: list[str] = []
    config = load_config(path, problems=found)
    where = f"{config.source}: " if config.source else ""
    bad_rules = []
    for i, raw in enumerate(config.rules, start=1):
        try:
            parse_rule(raw, i)
        except ConfigError as exc:
            bad_rules.append(f"{where}{exc}")
    found += bad_rules
    found += _driver_problems(config, where)
    rules: list[Rule] = []
    server = None
    try:
        rules = [] if bad_rules else parse_rules(config)  # then: names used twice
    except ConfigError as exc:
        found.append(str(exc))
    try:
        server = server_from_config(config)  # reads the model's config.json
    except VramscopeError as exc:
        found.append(str(exc))
    if problems is not None:
        problems += found
    elif found:
        raise ConfigError("\n".join(found), problems=found)
    return CheckedConfig(config, rules, server)


def _driver_problems(config: Config, where: str) -> list[str]:
    """``database.url``'s driver when it is not installed: the store refuses it before it
    connects (``Store.open``), so ``config check`` says so too."""
    from vramscope.agent.database_url import database_driver_problem

    url = config["database.url"]
    problem = database_driver_problem(url)
    return [] if problem is None else [f"{where}database.url = {url!r}: {problem}"]


def open_store(args: argparse.Namespace, config: Config | None = None, *,
               reading: str | None = None) -> Store:
    """The store of ``--db`` (or ``database.url``). ``reading`` names a command that only
    reads: it refuses a database that does not exist instead of creating it."""
    from vramscope.agent.store import Store

    config = config or config_from_args(args)
    if reading:
        require_existing_database(config["database.url"], reading)
    return Store.from_config(config)


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
