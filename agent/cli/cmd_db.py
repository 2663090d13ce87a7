"""``vramscope db upgrade | current | stamp REV | downgrade REV``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from vramscope.agent.cli import progress
from vramscope.agent.cli.common import add_config_flag, add_db_flag, config_from_args
from vramscope.agent.errors import StoreError

if TYPE_CHECKING:
    from vramscope.agent.store import Store

# the actions that take a REV, and the name each accepts besides the known revisions
REVISION_ENDS = {"stamp": "head", "downgrade": "base"}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("db", help="database schema migrations (Alembic)")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    for name, help_text in (
            ("upgrade", "upgrade the schema to the newest revision"),
            ("current", "print the schema revision of the database"),
            ("stamp", "record REV as the schema's revision without migrating (a vramscope "
                      "database whose alembic_version was lost)"),
            ("downgrade", "downgrade the schema to REV ('base' drops all)")):
        a = actions.add_parser(name, help=help_text)
        if name in REVISION_ENDS:
            a.add_argument("revision", metavar="REV")
        add_db_flag(a)
        add_config_flag(a)
        a.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError
    from vramscope.agent.store import Store, migrate

    config = config_from_args(args)
    store = Store.from_config(config, upgrade=False)
    try:
        if args.action == "upgrade":
            _upgrade(store)
        elif args.action in REVISION_ENDS:
            end = REVISION_ENDS[args.action]
            if args.revision != end and args.revision not in migrate.known_revisions():
                raise StoreError(f"unknown revision {args.revision!r}; known: {end}, "
                                 f"{', '.join(sorted(migrate.known_revisions()))}")
            move = migrate.stamp if args.action == "stamp" else migrate.downgrade
            move(store.engine, args.revision)
        rev = migrate.current_revision(store.engine)
    except SQLAlchemyError as exc:
        raise StoreError(f"{store.safe_url}: {exc}") from None
    finally:
        store.close()
    head = migrate.head_revision()
    state = "head" if rev == head else f"head is {head}"
    print(f"{store.safe_url}: revision {rev or 'base (empty)'} ({state})")
    return 0


def _upgrade(store: Store) -> None:
    """``ensure_schema``, with the migrations run so far on a terminal: one of them can
    rewrite a table of millions of rows (0006 partitions the samples)."""
    from vramscope.agent.store import migrate

    steps = migrate.pending(store.engine)
    if not steps:
        store.ensure_schema()  # at head already, or refused with its reason
        return
    shown = progress.shown("db upgrade", "migrations", len(steps), verb="run")
    shown.busy = f"running {steps[0]}"
    with shown:

        def on_migrated(revision: str) -> None:
            upcoming = steps[steps.index(revision) + 1:] if revision in steps else []
            shown.busy = f"running {upcoming[0]}" if upcoming else ""
            shown.advance(1)

        store.ensure_schema(on_migrated)
