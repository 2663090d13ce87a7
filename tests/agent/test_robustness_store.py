"""Database faults: a damaged, foreign or unstamped file is refused with a message that says
what is wrong and what to do, and is never written over; damage that appears while the agent
runs is found by the periodic quick_check and shown in `status`, /healthz and the log. Writes
that the database refuses for good are dropped alone, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from vramscope.agent.records import Phase, Sample
from vramscope.agent.store import Store

from tests.support.waiting import wait_for
from tools.agent_process import REPO_ROOT, AgentProcess


def _vramscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vramscope", *args], capture_output=True,
                          text=True, timeout=60, cwd=str(REPO_ROOT))


def _good_db(path: str, rows: int = 20_000) -> None:
    with Store.open(f"sqlite:///{path}", host_name="h") as st:
        st.write([Sample(1e9 + i, 0, Phase.IDLE, "x", 1, allocated_bytes=i) for i in range(rows)])


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _truncate(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 3)


def _zero(path: str) -> None:
    Path(path).write_bytes(b"\0" * os.path.getsize(path))


def _text(path: str) -> None:
    Path(path).write_text("not a database\n" * 100)


def _gzip(path: str) -> None:
    Path(path).write_bytes(gzip.compress(Path(path).read_bytes()))


@pytest.mark.parametrize("damage, reason", [
    (_truncate, "database disk image is malformed"),
    (_zero, "file is not a database"),
    (_text, "file is not a database"),
    (_gzip, "file is not a database"),
])
def test_a_damaged_file_is_refused_with_what_to_do_and_left_untouched(short_dir, damage, reason):
    db = f"{short_dir}/vs.db"
    _good_db(db)
    damage(db)
    before = _digest(db)
    done = _vramscope("agent", "--db", f"sqlite:///{db}", "--socket",
                      f"{short_dir}/run/agent.sock", "--no-nvml")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert (f"database file {db} is not a usable SQLite database ({reason}); vramscope will "
            f"not write over it. Check it with `sqlite3 {db} 'PRAGMA integrity_check'`, then "
            f"move it aside (`mv {db} {db}.broken`)") in done.stderr
    assert _digest(db) == before


def test_an_unstamped_database_is_refused_until_stamped(short_dir):
    db = f"{short_dir}/vs.db"
    _good_db(db, rows=10)
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE alembic_version")
    conn.commit()
    conn.close()  # checkpoints the WAL: the digest below is the whole database
    before = _digest(db)
    done = _vramscope("agent", "--db", f"sqlite:///{db}", "--socket",
                      f"{short_dir}/run/agent.sock", "--no-nvml")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert ("has tables (agent_stats, alerts, device_verdicts, devices, event_blocks) but no "
            "alembic_version, so its schema revision is unknown; vramscope will not write over "
            "it") in done.stderr
    assert "`vramscope db stamp head`" in done.stderr
    assert _digest(db) == before
    stamped = _vramscope("db", "stamp", "head", "--db", f"sqlite:///{db}")
    assert stamped.returncode == 0, stamped.stderr
    with Store.open(f"sqlite:///{db}") as st:
        assert st.count("samples") == 10


def _damage_pages_in_the_middle(path: str) -> None:
    """Overwrite a few pages well inside the file (not the schema page): the file still opens,
    but reading those pages fails."""
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.seek(size // 2 // 4096 * 4096)
        fh.write(os.urandom(4096 * 4))


def test_damage_while_running_is_found_by_the_periodic_check(short_dir):
    db = f"{short_dir}/vs.db"
    _good_db(db)
    agent = AgentProcess(f"sqlite:///{db}", f"{short_dir}/run/agent.sock",
                         log_path=f"{short_dir}/agent.log",
                         env={"VRAMSCOPE_DATABASE_INTEGRITY_CHECK_INTERVAL_S": "0.2"}).start()
    try:
        assert wait_for(lambda: agent.status()["db_integrity"])["ok"] is True
        _damage_pages_in_the_middle(db)
        result = wait_for(lambda: (r := agent.status()["db_integrity"]) and not r["ok"] and r)
        assert result["problem"]
        text = _vramscope("status", "--socket", agent.socket_path).stdout
        assert "INTEGRITY CHECK FAILED" in text
    finally:
        agent.stop()
    log_text = Path(f"{short_dir}/agent.log").read_text()
    assert log_text.count("database integrity check failed") == 1


def test_healthz_reports_a_damaged_database(short_dir):
    from vramscope.agent.config import parse_config
    from vramscope.dashboard.app import create_app

    db = f"{short_dir}/vs.db"
    _good_db(db)
    _damage_pages_in_the_middle(db)
    config = parse_config({"database": {"url": f"sqlite:///{db}"}}, None, {})
    client = create_app(config).test_client()
    reply = client.get("/healthz")
    assert reply.status_code == 503
    assert reply.get_json()["problem"].startswith("database integrity check failed: ")


def test_healthz_checks_no_more_often_than_its_cpu_budget(short_dir):
    """/healthz is polled by probes: a check waits at least 100 / max_cpu_percent times the
    CPU the last one took, whatever ``max_age_s`` says (a week-old file takes seconds)."""
    db = f"{short_dir}/vs.db"
    _good_db(db)
    with Store.open(f"sqlite:///{db}") as st:
        assert st.integrity(max_age_s=0.0, max_cpu_percent=0.01) is None  # checked: sound
        _damage_pages_in_the_middle(db)
        assert st.check_integrity() is not None  # a check now would find it...
        assert st.integrity(max_age_s=0.0, max_cpu_percent=0.01) is None  # ...not yet due


def test_a_sound_database_is_healthy(short_dir):
    from vramscope.agent.config import parse_config
    from vramscope.dashboard.app import create_app

    db = f"{short_dir}/vs.db"
    _good_db(db, rows=100)
    config = parse_config({"database": {"url": f"sqlite:///{db}"}}, None, {})
    assert create_app(config).test_client().get("/healthz").get_json()["status"] == "ok"


@pytest.mark.postgres
def test_a_postgresql_restart_mid_stream_loses_and_doubles_nothing():
    """A server of its own, stopped while the writer has batches to commit and started again:
    the writer retries (transient), then every record is stored exactly once (the batch keys)."""
    from vramscope.agent.writer import Writer

    from tests.support.pgserver import PostgresServer

    server = PostgresServer()
    server.start()
    try:
        url = server.create_database("restart")
        store = Store.open(url, host_name="h")
        writer = Writer(store, batch_rows=500, batch_interval_s=0.05, max_backoff_s=0.5)
        writer.start()
        writer.put_many([Sample(1e9 + i, 0, Phase.IDLE, "pg", 1, allocated_bytes=i)
                         for i in range(2000)])
        wait_for(lambda: writer.stats.written_total >= 500)
        server.stop()
        writer.put_many([Sample(2e9 + i, 0, Phase.IDLE, "pg", 1, allocated_bytes=i)
                         for i in range(2000)])
        wait_for(lambda: writer.failing, timeout_s=20)
        server.start()
        wait_for(lambda: writer.stats.written_total >= 4000 and not writer.failing,
                 timeout_s=30)
        writer.stop()
        assert writer.stats.failed_attempts >= 1 and writer.stats.dropped_total == 0
        assert writer.stats.refused_total == 0
        got = sorted(s.ts_s for s in store.samples(source="pg"))
        assert len(got) == 4000 == len(set(got))
        store.close()
    finally:
        server.destroy()
