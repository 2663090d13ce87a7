"""Shared fixtures: a fresh SQLite store, a real PostgreSQL server, a fake clock, a short
folder for sockets."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

import pytest
from vramscope.agent.clock import FakeClock

from tests.support.tools import require_tool


@pytest.fixture
def promtool() -> str:
    """promtool's path; a test that needs it is skipped without it (failed under CI=true)."""
    return require_tool("promtool")


@pytest.fixture
def systemd_analyze() -> str:
    return require_tool("systemd-analyze")


@pytest.fixture
def short_dir():
    """A folder with a short path under /tmp: a Unix socket's path must fit in 108 bytes,
    which pytest's tmp_path often does not."""
    root = tempfile.mkdtemp(prefix="vs-", dir="/tmp")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock(1_700_000_000.0)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'vramscope.db'}"


@pytest.fixture
def store(sqlite_url):
    from vramscope.agent.store import Store

    s = Store.open(sqlite_url, host_name="testhost")
    yield s
    s.close()


@pytest.fixture(scope="session")
def postgres_server():
    """One real PostgreSQL server for the session, unless .ci/run already started one."""
    if os.environ.get("VRAMSCOPE_TEST_POSTGRES_URL"):
        yield None
        return
    from tests.support.pgserver import PostgresServer

    server = PostgresServer()
    server.start()
    yield server
    server.destroy()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A fresh, empty database on the real server, per test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    base = os.environ.get("VRAMSCOPE_TEST_POSTGRES_URL")
    if base:
        import psycopg

        plain = base.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return base.rsplit("/", 1)[0] + "/" + name
    return postgres_server.create_database(name)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_url(request, tmp_path) -> str:
    """Both backends: each test using it runs on SQLite and on a real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'vramscope.db'}"
    return request.getfixturevalue("postgres_url")
