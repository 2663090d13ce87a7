"""``vramscope import`` is idempotent (issue 45, item 6): a file imported twice, in one command
or two, or files that overlap, store no row twice, and each file's line says how many of its
records were already there; the alert engine runs over the new records alone, so alerts and
verdicts are not stored twice either. A line a file says twice stays two rows. On SQLite and a
real PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from vramscope.agent.cli import main
from vramscope.agent.store import Store
from vramscope.agent.store.schema import alerts, events, samples, verdicts

DATA = Path(__file__).resolve().parents[1] / "data"
OOM = DATA / "gpu_oom.jsonl"  # 394 samples, 41 events, an OOM with its alerts


def _counts(url: str) -> dict[str, int]:
    with Store.open(url) as store, store.engine.connect() as c:
        return {t.name: c.execute(select(func.count()).select_from(t)).scalar_one()
                for t in (samples, events, alerts, verdicts)}


def _import(capsys, url: str, *files: Path) -> list[str]:
    assert main(["import", *map(str, files), "--db", url]) == 0
    return capsys.readouterr().out.splitlines()


def test_one_file_twice_in_one_command_stores_each_row_once(any_url, capsys, tmp_path):
    out = _import(capsys, any_url, OOM, OOM)
    assert out[0] == f"{OOM}: imported 394 samples and 41 events"
    assert out[1] == (f"{OOM}: imported 0 samples and 0 events; 394 samples and 41 events "
                      f"were already there, not stored again")
    once = f"sqlite:///{tmp_path / 'once.db'}"  # the file imported once, on its own
    _import(capsys, once, OOM)
    assert _counts(any_url) == _counts(once)


def test_a_file_imported_again_adds_no_row_alert_or_verdict(any_url, capsys):
    _import(capsys, any_url, OOM)
    first = _counts(any_url)
    assert (first["samples"], first["events"]) == (394, 41) and first["alerts"] > 0
    out = _import(capsys, any_url, OOM)
    assert "394 samples and 41 events were already there" in out[0]
    assert _counts(any_url) == first


def test_overlapping_files_store_their_union(any_url, capsys, tmp_path):
    lines = OOM.read_text().splitlines(keepends=True)
    head, tail = tmp_path / "head.jsonl", tmp_path / "tail.jsonl"
    head.write_text("".join(lines[:300]))
    tail.write_text("".join(lines[200:]))
    out = _import(capsys, any_url, head, tail)
    assert "were already there" in out[1] and "were already there" not in out[0]
    counts = _counts(any_url)
    assert (counts["samples"], counts["events"]) == (394, 41)
    there = out[1].split("; ")[1]
    samples_there, events_there = int(there.split()[0]), int(there.split()[3])
    assert samples_there + events_there == 100  # the lines both files hold


def test_a_line_a_file_says_twice_is_two_rows_once(any_url, capsys, tmp_path):
    line = '{"ts": 1700000000.0, "device": 0, "source": "torch", "allocated_bytes": 1}\n'
    trace = tmp_path / "twice.jsonl"
    trace.write_text(line * 3)
    _import(capsys, any_url, trace)
    out = _import(capsys, any_url, trace)
    assert "3 samples and 0 events were already there" in out[0]
    assert _counts(any_url)["samples"] == 3


@pytest.mark.slow
def test_a_day_of_records_twice_in_two_batches_of_files(any_url, capsys, tmp_path):
    """More than one chunk of 5,000 records: the look-up of what is stored spans chunks."""
    trace = tmp_path / "long.jsonl"
    with open(trace, "w") as fh:
        for i in range(12_000):
            fh.write(f'{{"ts": {1700000000 + i * 0.1:.1f}, "device": {i % 4}, '
                     f'"source": "torch", "allocated_bytes": {i}}}\n')
    _import(capsys, any_url, trace, trace)
    assert _counts(any_url)["samples"] == 12_000
