"""``analyze --db`` reads one device's window at a time and gives the document a trace file of
the same window gives."""

from __future__ import annotations

import json

import pytest
from vramscope.agent.cli import main
from vramscope.agent.store import Store
from vramscope.agent.trace import write_trace

from tools.history_generator import T_END, History, generate


@pytest.fixture
def week_db(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with Store.open(url) as store:  # the machine's host name, as the CLI's default
        # no stored verdicts: analyze --db replays the window, as analyze of its export does
        generate(store, History(devices=4, hz=0.05, days=1, rollups=False, verdicts=False))
    return url


def _analyze(capsys, *argv: str) -> dict:
    assert main(["analyze", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_window_of_the_database_is_analyzed_like_the_same_window_exported(
        week_db, tmp_path, capsys):
    since, until = T_END - 6 * 3600, T_END - 3600
    from_db = _analyze(capsys, "--db", week_db, "--since", str(since), "--until", str(until))
    with Store.open(week_db) as store:
        samples = list(store.iter_samples(None, since, until))
        events = store.events(None, since, until)
    trace = tmp_path / "window.jsonl"
    with open(trace, "w", encoding="utf-8") as out:
        write_trace(out, samples, events)
    from_file = _analyze(capsys, str(trace))
    assert from_db["devices"] == from_file["devices"]
    key = (lambda a: (a["fired_ts"], a["device"], a["rule"]))
    assert sorted(from_db["alerts"], key=key) == sorted(from_file["alerts"], key=key)
    # 5 hours at one sample per 20 s per device, the window's both ends included
    assert [sum(p["samples"] for p in d["phases"].values())
            for d in from_db["devices"].values()] == [901] * 4


def test_one_device_and_the_window_flags_need_the_database(week_db, capsys, tmp_path):
    doc = _analyze(capsys, "--db", week_db, "--device", "2", "--since", str(T_END - 600))
    assert list(doc["devices"]) == ["2"]
    assert main(["analyze", str(tmp_path / "x.jsonl"), "--since", "1"]) == 2
    assert "--since and --until need --db" in capsys.readouterr().err


def test_a_window_older_than_the_raw_samples_is_named_on_stderr(tmp_path, capsys):
    """Three days of history, raw samples kept for the newest, no stored verdicts: analyze says
    where they begin and that older history is only in the tiers; the JSON document is
    unchanged by it. (With stored verdicts, those are the answer: test_one_answer.py.)"""
    from vramscope.agent.timefmt import iso_utc

    url = f"sqlite:///{tmp_path / 'tiered.db'}"
    with Store.open(url) as store:
        generate(store, History(devices=1, hz=0.05, days=3, raw_days=1, verdicts=False))
    first_raw = T_END - 86_400
    doc = _analyze(capsys, "--db", url, "--since", str(T_END - 2 * 86_400))
    assert set(doc["devices"]) == {"0"}
    assert main(["analyze", "--json", "--db", url, "--since", str(T_END - 2 * 86_400)]) == 0
    err = capsys.readouterr().err
    assert (f"note: device 0: raw samples from {iso_utc(first_raw)}; from "
            f"{iso_utc(T_END - 2 * 86_400)} the store keeps only the per-second tier") in err
    assert main(["analyze", "--json", "--db", url, "--since", str(first_raw + 60)]) == 0
    assert "note:" not in capsys.readouterr().err  # the window is all raw
