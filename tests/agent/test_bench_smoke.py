"""``vramscope bench NAME --quick --json`` runs every benchmark whose module exists and returns
figures with the documented keys (docs/BENCHMARKS.md). Quick sizes keep each run to seconds.

A registry entry whose module is not written yet is skipped *with its name and reason* (shown
by ``-ra``); once the module exists, the benchmark must run. GPU benchmarks (their registry
description starts with "GPU") must report themselves skipped without CUDA, never crash.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
from vramscope.agent.cli import main

from tools.bench import BENCHMARKS, Figure

FIGURE_KEYS = {"bench", "metric", "value", "unit", "spread", "baseline", "target", "met", "where"}
DOC = Path(__file__).resolve().parents[2] / "docs" / "BENCHMARKS.md"


def _is_gpu(name: str) -> bool:
    return BENCHMARKS[name][1].startswith("GPU")


def _cuda() -> bool:
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return False
    import torch

    return torch.cuda.is_available()


def run_bench(name: str, capsys) -> dict:
    capsys.readouterr()
    assert main(["bench", name, "--quick", "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_bench_quick_json(name, capsys):
    doc = run_bench(name, capsys)  # a registered module that is missing fails here
    assert doc["format"] == "vramscope.bench/1"
    if name == "vllm" and importlib.util.find_spec("vllm") is None:  # its own venv has it
        assert [s["bench"] for s in doc["skipped"]] == ["vllm"]
        assert "needs vLLM" in doc["skipped"][0]["error"]
        return
    if name == "fleet":  # a fleet shares one PostgreSQL: tests/agent/test_bench_fleet.py
        assert [s["bench"] for s in doc["skipped"]] == ["fleet"]
        assert "needs a PostgreSQL server" in doc["skipped"][0]["error"]
        return
    if _is_gpu(name) and not _cuda():
        assert doc["figures"] == []
        assert [s["bench"] for s in doc["skipped"]] == [name]
        assert "CUDA" in doc["skipped"][0]["error"]
        return
    assert doc["skipped"] == [], doc["skipped"]
    assert doc["figures"], f"benchmark {name!r} returned no figures"
    for f in doc["figures"]:
        assert set(f) == FIGURE_KEYS, f
        assert f["bench"] == name
        assert isinstance(f["value"], (int, float)) and math.isfinite(f["value"]), f
        assert f["metric"] and f["unit"], f
        assert f["met"] in (True, False, None)
        if f["target"]:
            assert f["met"] is not None, f"{name}: {f['metric']} has a target but no verdict"


def test_figure_keys_are_the_documented_ones():
    assert set(Figure("b", "m", 1.0, "x").to_json()) == FIGURE_KEYS
    text = DOC.read_text()
    assert all(f"`{key}`" in text for key in FIGURE_KEYS)


def _sections(text: str) -> dict[str, str]:
    """Each ``## `name` ...`` section's body, by the benchmark it is named for."""
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    return {m.group(1): part for part in parts if (m := re.match(r"`(\w+)`", part))}


def test_the_report_has_one_section_per_benchmark_each_with_its_own_current_table():
    text = DOC.read_text()
    assert len(text.splitlines()) <= 400  # issue 46: current figures, the history left to git
    sections = _sections(text)
    assert list(sections) == list(BENCHMARKS)
    tables = {name: re.findall(r"<!-- bench-table (.*?) -->", body)
              for name, body in sections.items()}
    # every benchmark one table of its own figures only
    assert [name for name, found in tables.items() if len(found) != 1] == []
    for name, (sources,) in ((n, t) for n, t in tables.items() if t):
        assert [s.partition("=")[0].partition("#")[2] for s in sources.split()] == (
            [name] * len(sources.split())), sources
        assert "**Target" in sections[name] and "vramscope bench" in sections[name], name


def test_every_committed_bench_json_is_read_by_a_doc():
    root = DOC.parents[1]
    docs = "".join(p.read_text() for p in (root / "docs").glob("*.md"))
    unread = [p.name for p in sorted((root / "docs" / "bench").glob("*.json"))
              if p.name not in docs]
    assert unread == []


def test_hook_cost_figures_add_up_per_decode_token():
    from tools.bench.hooks import hook_cost_figures

    cost = {"step_s": 2e-6, "request_s": 64e-6, "new_tokens": 16, "sampler_s_per_s": 1e-3}
    per_token, share = hook_cost_figures(cost, {"off_s": [0.012, 0.010, 0.008]})
    # 2 us a step + 64 us / 16 tokens + 1 ms per second x 10 ms a token = 16 us of 10 ms
    assert per_token.value == pytest.approx(16.0) and per_token.unit == "us"
    assert share.value == pytest.approx(0.16) and share.met is True
    assert hook_cost_figures({**cost, "step_s": 150e-6}, {"off_s": [0.01]})[1].met is False


def test_hook_cost_is_timed_through_the_real_hooks_on_cpu():
    torch = pytest.importorskip("torch")
    from vramscope.hooks import install as inst

    from tests.support.tiny_models import tiny_llama
    from tools.bench.hooks import measure_hook_cost

    cost = measure_hook_cost(torch, tiny_llama(), batch=2, new_tokens=8, steps=200, requests=20)
    # what was timed went through the real hooks: each timed request's prefill was seen once
    # (how long it took is the bench's figure, not a unit test's: this machine is shared)
    assert cost["prefills_seen"] == 20 and cost["new_tokens"] == 8
    assert cost["step_s"] > 0 and cost["request_s"] >= 0
    # no CUDA: no allocator task; the one task is the rank watch
    assert cost["sampler_s_per_s"] > 0
    assert not inst.installed()  # uninstalled after measuring


def test_benchmarks_doc_tables_are_rendered_from_the_committed_json():
    from tools.bench.tables import render

    text = DOC.read_text()
    assert text.count("<!-- bench-table ") == len(BENCHMARKS)  # one each
    assert render(text, DOC.parent) == text, (
        "docs/BENCHMARKS.md is out of date: "
        "python -m tools.bench.tables docs/BENCHMARKS.md")


def test_the_kv_agreement_figures_in_docs_vllm_are_rendered_from_the_committed_json():
    from tools.bench.tables import render

    text = (DOC.parent / "vllm.md").read_text()
    assert "<!-- bench-table bench/vllm-kv-agreement.json=" in text
    assert render(text, DOC.parent) == text, (
        "docs/vllm.md is out of date: python -m tools.bench.tables docs/vllm.md")


def test_report_renders_rows_and_names_bad_input(tmp_path):
    from tools.bench.tables import render, rows

    doc = {"format": "vramscope.bench/1",
           "figures": [Figure("ingest", "a|b", 123456.7, "samples/s", "min 1 / max 2",
                              target=">= 1", met=False).to_json()],
           "skipped": [{"bench": "hooks", "error": "needs CUDA"}]}
    assert rows(doc, "CPU") == [
        "| ingest | a\\|b | 1.235e+05 | samples/s | min 1 / max 2 | >= 1 | **missed** | CPU |",
        "| hooks | skipped: needs CUDA |  |  |  |  |  | CPU |"]
    with pytest.raises(ValueError, match="not a vramscope.bench/1 document"):
        rows({"figures": []}, "CPU")
    (tmp_path / "a.json").write_text(json.dumps(doc))
    md = "x\n<!-- bench-table a.json=GPU_box -->\nstale\n<!-- /bench-table -->\ny\n"
    out = render(md, tmp_path)
    assert "stale" not in out and out.endswith("| GPU box |\n<!-- /bench-table -->\ny\n")
    with pytest.raises(ValueError, match="'a.json': expected FILE=LABEL"):
        render(md.replace("a.json=GPU_box", "a.json"), tmp_path)
    # FILE#BENCH: one benchmark's figures and skips of a file that holds several
    assert rows(doc, "CPU", "hooks") == ["| hooks | skipped: needs CUDA |  |  |  |  |  | CPU |"]
    assert render(md.replace("a.json=", "a.json#ingest="), tmp_path).count("| ingest |") == 1
    with pytest.raises(ValueError, match="'a.json#kvpool=CPU': a.json has no figures of bench "
                                         "'kvpool'"):
        render(md.replace("a.json=GPU_box", "a.json#kvpool=CPU"), tmp_path)
