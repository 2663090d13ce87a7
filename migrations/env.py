"""Alembic environment: upgrade through the connection the store passes in (Alembic cookbook,
"Sharing a Connection across one or more programmatic migration commands")."""

from __future__ import annotations

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
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies the table
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("vramscope migrations run online only (vramscope db upgrade)")
run_migrations_online()
