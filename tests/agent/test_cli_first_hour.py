"""The first hour of a new user (issue 34): the demo keeps its database and says where up
front (item 1); ``--db`` takes a plain path in every command (item 2); ``import`` says where it
wrote (item 6); ``status`` without an agent says what is known of each device (item 11).
Each runs the real CLI, most as real processes with their own data directory."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vramscope.agent.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]
TRACE = ('{"ts": 1800000000.0, "device": 0, "allocated_bytes": 1048576}\n'
         '{"ts": 1800000001.5, "device": 0, "allocated_bytes": 2097152}\n')


def _env(folder: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": str(folder / "config"),
            "XDG_RUNTIME_DIR": str(folder / "run"), "XDG_DATA_HOME": str(folder / "data"),
            "TMPDIR": str(folder)}


def _vramscope(args: list[str], folder: Path, timeout_s: float = 60.0):
    return subprocess.run([sys.executable, "-m", "vramscope", *args], cwd=folder,
                          env=_env(folder), capture_output=True, text=True, timeout=timeout_s)


# --- item 2: a plain path for --db, everywhere --------------------------------------------------
def _db_flags():
    """Every subcommand (and sub-subcommand) that has a --db flag, found in the parser itself:
    a command added later with its own --db is covered too."""
    found = []

    def walk(parser, words):
        for action in parser._actions:
            if "--db" in action.option_strings:
                found.append((words, action))
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*words, name])

    walk(build_parser(), [])
    return found


def test_every_db_flag_takes_a_path_as_that_sqlite_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flags = _db_flags()
    assert {" ".join(w) for w, _ in flags} >= {
        "demo", "agent", "dashboard", "status", "analyze", "import", "export", "bench",
        "db upgrade", "db current", "db downgrade"}
    for words, action in flags:  # the old code kept "/x/demo.db" as a URL nothing could parse
        assert action.type("/x/demo.db") == "sqlite:////x/demo.db", words
        assert action.type("rel/demo.db") == f"sqlite:///{tmp_path}/rel/demo.db", words
        assert action.type("postgresql+psycopg://h/db") == "postgresql+psycopg://h/db", words


def test_a_path_works_from_import_to_analyze_export_and_status(tmp_path):
    (tmp_path / "t.jsonl").write_text(TRACE)
    proc = _vramscope(["import", "t.jsonl", "--db", "rec/x.db"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    db = tmp_path / "rec" / "x.db"
    assert proc.stdout == f"t.jsonl: imported 2 samples and 0 events\nwritten to {db}\n"
    analyzed = _vramscope(["analyze", "--db", "rec/x.db", "--json"], tmp_path)
    assert list(json.loads(analyzed.stdout)["devices"]) == ["0"]
    exported = _vramscope(["export", "--db", str(db)], tmp_path)
    assert [json.loads(line)["allocated_bytes"] for line in exported.stdout.splitlines()] == [
        1048576, 2097152]
    status = _vramscope(["status", "--db", "rec/x.db", "--socket", "no.sock", "--json"],
                        tmp_path)
    assert json.loads(status.stdout)["database"] == f"sqlite:///{db}"


def test_a_reading_command_still_refuses_a_missing_path(tmp_path, capsys):
    typo = tmp_path / "typo" / "x.db"
    assert main(["analyze", "--db", str(typo)]) == 1
    assert capsys.readouterr().err.startswith(f"vramscope: error: database {typo} does not "
                                              f"exist (URL sqlite:///{typo})")
    assert not typo.parent.exists()


# --- item 6: import says where it wrote ------------------------------------------------------
def test_import_without_db_says_which_database_it_wrote(tmp_path):
    (tmp_path / "t.jsonl").write_text(TRACE)
    proc = _vramscope(["import", "t.jsonl"], tmp_path)
    db = tmp_path / "data" / "vramscope" / "vramscope.db"
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ("t.jsonl: imported 2 samples and 0 events\n"
                           f"written to {db} (database.url of the config; --db PATH to "
                           "choose)\n")
    assert db.is_file()


# --- item 1: the demo keeps its database, and says so before it starts -----------------------
def test_the_demo_says_up_front_where_its_database_is_kept(tmp_path):
    kept = tmp_path / "data" / "vramscope" / "demo.db"
    kept.parent.mkdir(parents=True)
    kept.write_text("the previous demo's")  # the next demo without --db starts it afresh
    proc = _vramscope(["demo", "--duration", "1", "--history-min", "0", "--no-browser",
                       "--port", "0"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[3] == (f"  database: {kept} (kept when the demo ends; the next demo without "
                        "--db starts it afresh; --db PATH to choose)")
    assert lines[-1] == (f"database kept: {kept}; look at it again with 'vramscope dashboard "
                         f"--db {kept}' or 'vramscope analyze --db {kept}'")
    again = _vramscope(["analyze", "--db", str(kept), "--json"], tmp_path)
    assert sorted(json.loads(again.stdout)["devices"]) == ["0", "1", "2"]


def test_the_demo_keeps_a_database_given_as_a_path(tmp_path):
    proc = _vramscope(["demo", "--duration", "1", "--history-min", "0", "--no-browser",
                       "--port", "0", "--db", "mine/demo.db"], tmp_path)
    mine = tmp_path / "mine" / "demo.db"
    assert proc.returncode == 0, proc.stderr[-2000:]  # the old code: "Could not parse URL"
    assert proc.stdout.splitlines()[3] == (f"  database: {mine} (kept when the demo ends; "
                                           "--db PATH to choose)")
    assert mine.is_file()
    assert not (tmp_path / "data" / "vramscope" / "demo.db").exists()


# --- item 11: status without an agent says what is known -------------------------------------
@pytest.fixture
def stored(tmp_path):
    from vramscope.agent.records import Phase, Sample
    from vramscope.agent.store import Store

    url = f"sqlite:///{tmp_path}/s.db"
    with Store.open(url) as store:
        store.describe_device(0, uuid="GPU-1234-abcd", name="NVIDIA H200",
                              total_bytes=150_000_000_000)
        store.write([Sample(1_800_000_000.0, 0, Phase.IDLE, "nvml", device_used_bytes=1),
                     Sample(1_800_000_000.0, 1, Phase.IDLE, "torch", allocated_bytes=1)], [])
    return url


def test_status_without_an_agent_names_what_the_store_knows(stored, tmp_path, capsys,
                                                            monkeypatch):
    import time

    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0 + 3 * 3600)
    assert main(["status", "--db", stored, "--socket", str(tmp_path / "no.sock")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:5] == [
        "devices: 2",
        "  0: NVIDIA H200, GPU-1234-abcd, 139.7 GiB; last seen 2027-01-15T08:00:00.000Z "
        "(3.0 h ago)",  # the old code: "0: NVIDIA H200 GPU-1234-abcd"
        "  1: no name or UUID recorded (its records came without NVML); last seen "
        "2027-01-15T08:00:00.000Z (3.0 h ago)"]  # the old code: "1: ?"


def test_status_of_an_empty_store_says_nothing_is_known(tmp_path, capsys):
    from vramscope.agent.store import Store

    url = f"sqlite:///{tmp_path}/empty.db"
    Store.open(url).close()
    assert main(["status", "--db", url, "--socket", str(tmp_path / "no.sock")]) == 1
    assert capsys.readouterr().out.splitlines()[2] == "devices: none recorded in this database"


def test_messages_name_a_sqlite_file_by_its_path_and_hide_a_password():
    from vramscope.agent.cli.common import shown_db

    assert shown_db("sqlite:////srv/x.db") == "/srv/x.db"
    assert shown_db("postgresql+psycopg://vs:s3cret@db:5432/vs") == (
        "postgresql+psycopg://vs:***@db:5432/vs")
    assert shown_db("postgresql+psycopg://db/vs") == "postgresql+psycopg://db/vs"
