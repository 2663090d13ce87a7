"""Commands that only read refuse a database that does not exist (a mistyped path must not
become a new, empty database that looks healthy); ``dashboard --port 0`` takes any free port;
``status`` sees a running demo; the demo keeps its database where it said it would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vramscope.agent.cli import main

REPO = Path(__file__).resolve().parents[2]


def _env(folder: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": str(folder),
            "XDG_RUNTIME_DIR": str(folder), "XDG_DATA_HOME": str(folder / "data"),
            "TMPDIR": str(folder)}


def _vramscope(args: list[str], folder: Path, timeout_s: float = 60.0):
    return subprocess.run([sys.executable, "-m", "vramscope", *args], cwd=folder,
                          env=_env(folder), capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.parametrize("argv", [["analyze", "--db"], ["export", "--db"]])
def test_reading_commands_refuse_a_missing_sqlite_file(argv, tmp_path, capsys):
    typo = tmp_path / "srv" / "typo" / "x.db"
    assert main([*argv, f"sqlite:///{typo}"]) == 1
    err = capsys.readouterr().err
    command = argv[0]
    assert err.startswith(f"vramscope: error: database {typo} does not exist")
    assert f"'vramscope {command}' only reads an existing database" in err
    assert "'vramscope db upgrade --db URL' creates an empty one" in err
    assert not typo.parent.exists()  # neither the file nor its folder was made


def test_dashboard_refuses_a_missing_database_before_serving(tmp_path):
    typo = tmp_path / "typo" / "x.db"
    proc = _vramscope(["dashboard", "--db", f"sqlite:///{typo}", "--port", "0"], tmp_path,
                      timeout_s=30)  # the old code served an empty dashboard until killed
    assert proc.returncode == 1
    assert f"database {typo} does not exist" in proc.stderr
    assert "'vramscope dashboard' only reads" in proc.stderr
    assert not typo.parent.exists()


def test_status_names_the_missing_database_and_how_to_create_one(tmp_path, capsys):
    typo = tmp_path / "typo.db"
    sock = tmp_path / "no-agent.sock"
    assert main(["status", "--db", f"sqlite:///{typo}", "--socket", str(sock)]) == 1
    out = capsys.readouterr().out
    assert f"database: sqlite:///{typo} does not exist; check --db or database.url" in out
    assert "'vramscope agent'" in out
    assert not typo.exists()


def test_import_still_creates_a_database(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"ts": 1000.0, "device": 0, "allocated_bytes": 1}\n')
    db = tmp_path / "new" / "x.db"
    assert main(["import", str(trace), "--db", f"sqlite:///{db}"]) == 0
    assert db.is_file()
    capsys.readouterr()
    assert main(["analyze", "--db", f"sqlite:///{db}", "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["devices"]) == ["0"]


def test_dashboard_port_0_takes_any_free_port(tmp_path):
    from vramscope.agent.store import Store

    db = tmp_path / "x.db"
    Store.open(f"sqlite:///{db}").close()
    proc = subprocess.Popen([sys.executable, "-m", "vramscope", "dashboard", "--db",
                             f"sqlite:///{db}", "--port", "0"], cwd=tmp_path, env=_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # the old code refused --port 0 (dashboard.port >= 1)
        assert line.startswith("vramscope dashboard on http://127.0.0.1:"), proc.stderr.read()
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        assert port not in (0, 8321)
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            assert json.load(r)["status"] == "ok"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _demo_socket(demo: subprocess.Popen[str]) -> str:
    """The socket the demo names as its own (its announcement's line)."""
    assert demo.stdout is not None
    for line in demo.stdout:
        if line.startswith("  agent socket: "):
            return line.split("agent socket: ", 1)[1].split(" ", 1)[0]
    raise AssertionError("the demo named no socket of its own")


def test_status_sees_a_running_demo_and_the_demo_keeps_its_database(tmp_path):
    """The demo's embedded agent serves a socket of its own (issue 45, item 8), which it
    names, so ``status --socket`` reaches it; its database is kept when it ends, in the data
    directory, and no temporary folder is left."""
    demo = subprocess.Popen([sys.executable, "-m", "vramscope", "demo", "--duration", "8",
                             "--no-browser", "--port", "0", "--history-min", "5"],
                            cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        status = None
        socket_path = _demo_socket(demo)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and demo.poll() is None:
            proc = _vramscope(["status", "--json", "--socket", socket_path], tmp_path)
            status = json.loads(proc.stdout)
            if status.get("running"):
                break
            time.sleep(0.5)
        assert status and status["running"], status
        assert proc.returncode == 0
        assert {d["index"] for d in status["devices"]} == {0, 1, 2}
        out, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, err[-2000:]
    assert not Path(socket_path).parent.exists()  # its own folder goes with it
    kept = tmp_path / "data" / "vramscope" / "demo.db"  # $XDG_DATA_HOME/vramscope/demo.db
    assert f"database kept: {kept};" in out
    assert kept.is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("vramscope-demo-")] == []


def test_demo_summary_says_when_the_simulation_fell_behind(store):
    from types import SimpleNamespace

    from vramscope.agent.sim.demo import summary

    server = SimpleNamespace(spec=SimpleNamespace(device=1, scenario="leak"), now_s=1_800_000_000.0,
                             counts={"served": 10, "aborted": 0, "ooms": 0})
    store.open_alert("memory_leak", "warning", 1_799_999_000.0, device=1, message="leak")
    behind = summary(store, [server], now_s=1_800_000_000.0 + 3 * 3600)
    assert behind[0] == ("  simulation stopped 3.0 h behind real time: its newest data is from "
                         "2027-01-15T08:00:00.000Z (--speed or --duration to catch up)")
    assert behind[2] == ("  alert memory_leak (warning, active) on device 1 at "
                         "2027-01-15T07:43:20.000Z")
    caught_up = summary(store, [server], now_s=1_800_000_001.0)
    assert not any("behind" in line for line in caught_up)
