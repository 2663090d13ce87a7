"""Whether a database URL names a store vramscope writes to, and whether its driver is here.

One check of ``database.url`` and ``--db`` for ``config check``, the agent and every command
(the setting's check in ``settings.py``, and ``Store.open`` before it connects). It reads the
URL's text and asks ``importlib`` whether a module is installed, nothing more: the in-server
hooks load the same settings table, without the store's drivers, so this is part of the core
(docs/architecture.md).
"""

from __future__ import annotations

# The databases the store writes to, by SQLAlchemy's name, each with the driver SQLAlchemy loads
# when the URL names none; SQLAlchemy's driver names with the module each imports and the extra
# of vramscope that installs it (None: the standard library's, or none of ours).
DATABASE_DEFAULT_DRIVERS = {"sqlite": "pysqlite", "postgresql": "psycopg2"}
DATABASE_DRIVERS: dict[str, tuple[str, str | None]] = {
    "pysqlite": ("sqlite3", None), "psycopg": ("psycopg", "postgres"),
    "psycopg2": ("psycopg2", None), "pg8000": ("pg8000", None)}
# What each extra installs (pyproject.toml's optional-dependencies; tests/agent/
# test_config_database_url.py checks they agree). The hints name the requirement itself:
# vramscope is on no package index, so `pip install 'vramscope[postgres]'` would find nothing.
EXTRA_REQUIREMENTS = {"postgres": "psycopg[binary]>=3.1"}
_URL_EXAMPLES = ("sqlite:///path.db or postgresql+psycopg://host/db (the 'postgres' extra: "
                 f"pip install '{EXTRA_REQUIREMENTS['postgres']}')")


def database_url_problem(url: str) -> str | None:
    """What is wrong with a database URL for vramscope's store, or None: the one check of
    ``database.url`` and ``--db`` for ``config check``, the agent and every command (the
    setting's check, and ``Store.open`` before it connects). Reads the URL's text only: the
    in-server hooks load the same settings, without the store's drivers."""
    if "://" not in url:
        return f"expected a database URL such as {_URL_EXAMPLES}"
    backend, _, driver = url.split("://", 1)[0].partition("+")
    if backend not in DATABASE_DEFAULT_DRIVERS:
        return (f"{backend!r} is not a database vramscope stores to; it stores to SQLite or "
                f"PostgreSQL: {_URL_EXAMPLES}")
    return None


def database_driver_problem(url: str) -> str | None:
    """The URL's driver when it is not installed, with what installs it, or None (also None
    for a URL :func:`database_url_problem` refuses). The agent and ``config check`` both ask,
    before any connection, so neither accepts a URL the other refuses."""
    import importlib.util

    if database_url_problem(url) is not None:
        return None
    backend, _, driver = url.split("://", 1)[0].partition("+")
    driver = driver or DATABASE_DEFAULT_DRIVERS[backend]
    module, extra = DATABASE_DRIVERS.get(driver, (driver, None))
    try:
        if importlib.util.find_spec(module) is not None:
            return None
    except (ImportError, ValueError):  # a driver name that is no module name at all
        pass
    if extra is not None:
        return (f"needs the {module!r} driver, which is not installed: pip install "
                f"'{EXTRA_REQUIREMENTS[extra]}' into vramscope's environment (its {extra!r} "
                "extra, docs/deployment.md)")
    ours = (", or name the driver of vramscope's 'postgres' extra: "
            "postgresql+psycopg://host/db") if backend == "postgresql" else ""
    return (f"needs the {module!r} driver ({backend}+{driver}), which is not installed and "
            f"which no vramscope extra installs: pip install {module}{ours}")
