"""One failing benchmark reports its error in the JSON; the others still run and report."""

from __future__ import annotations

import json
import types

import vramscope.agent.bench as bench
from vramscope.agent.bench import Figure
from vramscope.agent.cli import main


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
