"""The CLI edge: help for every command, exit codes, errors printed once without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from vramscope.agent.cli import COMMANDS, main


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert f"usage: vramscope {command}" in capsys.readouterr().out


def test_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["import"])
    assert info.value.code == 2
    assert "the following arguments are required: FILE" in capsys.readouterr().err


def test_unknown_benchmark_is_a_usage_error(capsys):
    assert main(["bench", "nonesuch"]) == 2
    assert "unknown benchmark 'nonesuch'" in capsys.readouterr().err


def test_failure_exits_1_without_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[dashboard]\nport = 'x'\n")
    proc = subprocess.run([sys.executable, "-m", "vramscope", "config", "check", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr == (f"vramscope: error: {bad}: dashboard.port must be an integer, "
                           f"got 'x'\n")


def test_bench_ingest_quick_json(capsys):
    assert main(["bench", "ingest", "--quick", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "vramscope.bench/1"
    metrics = {f["metric"]: f for f in doc["figures"]}
    ratio = metrics["store / raw rate"]
    assert ratio["unit"] == "ratio" and 0 < ratio["value"] < 10
    assert ratio["met"] == (ratio["value"] >= 0.5)
    assert metrics["raw sqlite3.executemany samples/s"]["value"] > 0


def test_import_vramscope_needs_no_torch():
    code = ("import sys, vramscope; vramscope.Phase; "
            "assert 'torch' not in sys.modules and 'sqlalchemy' not in sys.modules; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "ok", proc.stderr
