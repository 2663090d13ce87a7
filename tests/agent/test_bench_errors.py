"""One failing benchmark reports its error in the JSON; the others still run and report."""

from __future__ import annotations

import json
import types

from vramscope.agent.cli import main

import tools.bench as bench
from tools.bench import Figure


def test_a_failing_benchmark_is_reported_and_the_others_still_run(monkeypatch, capsys):
    def broken(_options):
        raise KeyError("no such column")

    def fine(_options):
        return [Figure("fine", "speed", 1.5, "x")]

    modules = {"broken": types.SimpleNamespace(run=broken),
               "fine": types.SimpleNamespace(run=fine)}
    for name in modules:
        monkeypatch.setitem(bench.BENCHMARKS, name, (f"tests.{name}", name))
    monkeypatch.setattr(bench, "load", modules.__getitem__)
    assert main(["bench", "broken", "fine", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [(f["bench"], f["value"]) for f in doc["figures"]] == [("fine", 1.5)]
    assert doc["skipped"] == []
    [error] = doc["errors"]
    assert (error["bench"], error["error"]) == ("broken", "KeyError: 'no such column'")
    assert "raise KeyError" in error["traceback"]


def test_rounds_reach_every_benchmark_and_zero_is_refused(monkeypatch, capsys):
    seen = []

    def counting(options):
        seen.append(bench.rounds_or(options, 3))
        return [Figure("counting", "rounds", float(seen[-1]), "rounds")]

    monkeypatch.setitem(bench.BENCHMARKS, "counting", ("tests.counting", "counting"))
    monkeypatch.setattr(bench, "load", lambda _name: types.SimpleNamespace(run=counting))
    assert main(["bench", "counting", "--json"]) == 0
    assert main(["bench", "counting", "--json", "--rounds", "1"]) == 0
    assert seen == [3, 1]
    capsys.readouterr()
    assert main(["bench", "counting", "--rounds", "0"]) == 2
    assert "--rounds must be at least 1, not 0" in capsys.readouterr().err
