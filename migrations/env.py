"""Alembic environment: upgrade through the connection the store passes in (Alembic cookbook,
"Sharing a Connection across one or more programmatic migration commands")."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection
from vramscope.agent.store.schema import metadata

config = context.config


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        from sqlalchemy import create_engine

        url = config.get_main_option("sqlalchemy.url")
        if url is None:
            raise SystemExit("alembic: no connection passed and no sqlalchemy.url configured")
        engine = create_engine(url)
        with engine.connect() as connection:
            _run(connection)
            connection.commit()
        engine.dispose()
    else:
        _run(connection)


def _run(connection: Connection) -> None:
    from vramscope.agent.store.partitions import names

    partitions = names(connection)  # samples's own (PostgreSQL, 0006): not tables of the schema
    dialect = connection.dialect.name

    def include_name(name: str | None, type_: str, _parents: Any) -> bool:
        return not (type_ == "table" and name in partitions)

    def include_object(obj: Any, _name: str | None, _type: str, reflected: bool,
                       _compare_to: Any) -> bool:
        # a constraint or index of one backend only (.ddl_if(dialect=...)): compared there only
        ddl_if = getattr(obj, "_ddl_if", None)
        return reflected or ddl_if is None or ddl_if.dialect in (None, dialect)

    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies the table
        compare_type=True,
        include_name=include_name,
        include_object=include_object,
        # after each step, when a caller asked (migrate.upgrade: `vramscope db upgrade` shows
        # its progress)
        on_version_apply=config.attributes.get("on_version_apply", ()),
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("vramscope migrations run online only (vramscope db upgrade)")
run_migrations_online()
