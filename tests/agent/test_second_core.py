"""A large ``import`` or ``analyze FILE`` runs the alert engine on a second core
(agent/second_core.py): the answer is the in-process one, exactly; a failure there is an error
here, and an import that fails writes nothing."""

from __future__ import annotations

import gzip
import json
import sqlite3
from functools import partial
from pathlib import Path

import pytest
from vramscope.agent import second_core
from vramscope.agent.cli import main
from vramscope.agent.records import Event, Phase, Sample
from vramscope.agent.trace import write_trace

from tools.bench import labelled_recordings as recordings


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> list[Path]:
    """Two files: a device whose floor rises to an OOM (a leak, then the diagnosis, which
    reads the file again up to the OOM) and a healthy second device."""
    out = tmp_path_factory.mktemp("traces")
    oom = recordings.growth_oom(5)
    other = recordings.steady(6, days=0.25)
    paths = [out / "oom.jsonl", out / "other.jsonl"]
    with open(paths[0], "w") as fh:
        write_trace(fh, oom.samples, oom.events)
    with open(paths[1], "w") as fh:
        write_trace(fh, [s._replace(device=1, pid=200) for s in other.samples],
                    [e._replace(device=1, pid=200) for e in other.events])
    return paths


def _in_child(monkeypatch, yes: bool) -> None:
    monkeypatch.setattr(second_core, "CHILD_MIN_BYTES", 0 if yes else 2**62)


def test_analyze_in_a_child_prints_the_in_process_document(traces, monkeypatch, capsys):
    docs = []
    for child in (False, True):
        _in_child(monkeypatch, child)
        assert main(["analyze", *map(str, traces), "--json"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[0] == docs[1]
    d0 = docs[1]["devices"]["0"]
    # the leak and the OOM's diagnosis (the second reading of the file, in the child)
    assert (d0["leak"]["state"], d0["oom"]["occurred"], d0["oom"]["cause"]) == (
        "leak", True, "growth")
    assert docs[1]["devices"]["1"]["leak"]["state"] == "no_leak"


def _verdicts(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as c:
        cols = [r[1] for r in c.execute("PRAGMA table_info(verdicts)") if r[1] != "id"]
        return c.execute(f"SELECT {', '.join(cols)} FROM verdicts ORDER BY "
                         f"{', '.join(cols)}").fetchall()


def _alerts(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT d.device_index, a.rule, a.severity, a.fired_ts_s, a.resolved_ts_s "
                         "FROM alerts a JOIN devices d ON d.id = a.device_id "
                         "ORDER BY a.fired_ts_s, d.device_index, a.rule").fetchall()


def test_import_in_a_child_stores_the_in_process_verdicts(traces, monkeypatch, capsys,
                                                         tmp_path):
    rows, alerts = [], []
    for child in (False, True):
        _in_child(monkeypatch, child)
        db = tmp_path / f"child-{child}.db"
        assert main(["import", *map(str, traces), "--db", str(db)]) == 0
        rows.append(_verdicts(db))
        alerts.append(_alerts(db))
    assert rows[0] == rows[1]
    # the alerts are stored as an agent stores them: those analyze FILE prints, no other
    assert alerts[0] == alerts[1]
    out = capsys.readouterr().out
    assert out.count("oom.jsonl: imported") == 2 and out.count("other.jsonl: imported") == 2
    assert main(["analyze", *map(str, traces), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)["alerts"]
    assert sorted(alerts[1], key=str) == sorted(
        [(a["device"], a["rule"], a["severity"], a["fired_ts"], a["resolved_ts"])
         for a in printed], key=str)
    assert {a[1] for a in alerts[1]} >= {"memory_leak", "oom"}
    with sqlite3.connect(tmp_path / "child-True.db") as c:
        states = set(c.execute("SELECT pid, leak_state FROM verdicts"))
    assert {(None, "leak"), (200, "no_leak")} <= states


def test_import_and_analyze_keep_every_alert_however_few_the_engine_s_history_keeps(
        traces, monkeypatch, capsys, tmp_path):
    from vramscope.agent.alerts import engine

    _in_child(monkeypatch, False)
    assert main(["analyze", *map(str, traces), "--json"]) == 0
    printed = sorted([(a["device"], a["rule"], a["severity"], a["fired_ts"], a["resolved_ts"])
                      for a in json.loads(capsys.readouterr().out)["alerts"]], key=str)
    assert len(printed) >= 3
    # the engine's history keeps only its newest change: the import takes them batch by batch
    monkeypatch.setattr(engine, "HISTORY_MAX", 1)
    db = tmp_path / "short-history.db"
    assert main(["import", *map(str, traces), "--db", str(db)]) == 0
    assert sorted(_alerts(db), key=str) == printed
    # and analyze FILE takes them the same way
    capsys.readouterr()
    assert main(["analyze", *map(str, traces), "--json"]) == 0
    assert sorted([(a["device"], a["rule"], a["severity"], a["fired_ts"], a["resolved_ts"])
                   for a in json.loads(capsys.readouterr().out)["alerts"]], key=str) == printed


def test_a_bad_line_while_the_child_runs_fails_the_import_and_writes_nothing(
        traces, monkeypatch, capsys, tmp_path):
    _in_child(monkeypatch, True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(traces[0].read_text() + '{"ts": 1, "allocated_bytes": -5}\n')
    db = tmp_path / "bad.db"
    lines = len(traces[0].read_text().splitlines()) + 1
    assert main(["import", str(bad), "--db", str(db)]) == 1
    assert f"bad.jsonl:{lines}: 'allocated_bytes' must be >= 0, got -5" in capsys.readouterr().err
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT count(*) FROM samples").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM verdicts").fetchone() == (0,)


def _batches(n: int) -> list[tuple[list[Sample], list[Event]]]:
    return [([Sample(float(i), 0, Phase.IDLE, "torch", 7, allocated_bytes=i)],
             [Event(float(i), "request_end", 0, 7, None, str(i), {"n": i})]) for i in range(n)]


def total(batches) -> tuple[int, list[dict]]:
    """A consumer: the samples' bytes, and each event's data (types that must survive)."""
    bytes_, data = 0, []
    for samples, events in batches:
        assert all(type(s) is Sample and type(s.phase) is Phase for s in samples)
        bytes_ += sum(s.allocated_bytes for s in samples)
        data += [e.data for e in events]
    return bytes_, data


def first_only(batches) -> int:
    """A consumer that stops after one batch: the child reads the rest and still answers."""
    for samples, _ in batches:
        return len(samples)
    return 0


def fails_at(n: int, batches) -> None:
    for i, _ in enumerate(batches):
        if i == n:
            raise ZeroDivisionError(f"batch {i}")


def test_a_child_consumer_gets_records_of_their_own_types_and_answers():
    assert second_core.consume(total, _batches(50), in_child=True) == (
        sum(range(50)), [{"n": i} for i in range(50)])
    assert second_core.consume(total, _batches(50), in_child=False) == (
        sum(range(50)), [{"n": i} for i in range(50)])
    assert second_core.consume(first_only, _batches(500), in_child=True) == 1


def test_a_consumer_that_raises_in_the_child_is_an_error_here_with_its_traceback():
    with pytest.raises(second_core.ChildFailed) as err:
        second_core.consume(partial(fails_at, 3), _batches(5000), in_child=True)
    assert "ZeroDivisionError: batch 3" in str(err.value)
    assert "in the second-core process" in str(err.value)


def test_only_large_inputs_are_worth_a_child(tmp_path, monkeypatch):
    monkeypatch.setattr(second_core, "CHILD_MIN_BYTES", 8000)
    plain, packed = tmp_path / "a.jsonl", tmp_path / "a.jsonl.gz"
    plain.write_bytes(b"x" * 5000)
    packed.write_bytes(gzip.compress(b"{}\n" * 300_000))  # ~1.5 kB compressed, counted x8
    assert not second_core.worth_a_child([plain])
    assert second_core.worth_a_child([plain, plain])
    assert second_core.worth_a_child([packed]) == (packed.stat().st_size * 8 >= 8000)
    assert not second_core.worth_a_child([tmp_path / "missing.jsonl", plain, plain])
    monkeypatch.setattr(second_core.os, "cpu_count", lambda: 1)
    assert not second_core.worth_a_child([plain, plain])
