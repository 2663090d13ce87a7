"""Does a database URL name a database that already exists?

Commands that only read (``analyze``, ``dashboard``, ``status``, ``export``) must not create a
database where a mistyped path points: SQLAlchemy's SQLite driver creates the file, and
:meth:`vramscope.agent.store.Store.open` its directory, on first connect. Only the agent,
``import`` and ``db upgrade`` create one.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError


def sqlite_file(url: str | URL) -> Path | None:
    """The file a ``sqlite`` URL opens, named as the driver opens it: pysqlite takes the path
    as written (no ``~`` expansion; relative to the working directory). ``None`` for another
    backend, an in-memory database, a ``file:`` URI or a URL that does not parse."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return None  # Store.open reports the bad URL with its own message
    if parsed.get_backend_name() != "sqlite":
        return None
    path = parsed.database
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    return Path(path)


def missing_sqlite_file(url: str) -> Path | None:
    """The file a ``sqlite`` URL names when it does not exist; ``None`` when it exists, is
    in memory, or the URL is not SQLite (a server database's existence shows on connect)."""
    file = sqlite_file(url)
    return None if file is None or file.is_file() else file
