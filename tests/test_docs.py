"""Docs match the code: every setting is documented; the README's commands are real."""

from __future__ import annotations

from pathlib import Path

from vramscope.agent.config import env_var_name
from vramscope.agent.settings import SETTINGS

ROOT = Path(__file__).resolve().parent.parent


def test_every_setting_is_documented():
    text = (ROOT / "docs" / "configuration.md").read_text()
    missing = [s.key for s in SETTINGS if f"`{s.key}`" not in text]
    assert missing == [], (
        f"undocumented settings: {missing} (run python -m tools.config_docs)")
    missing_env = [s.key for s in SETTINGS if env_var_name(s.key) not in text]
    assert missing_env == []


def test_documented_settings_exist():
    import re

    text = (ROOT / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+(?:\.[a-z_]+)+)` \|", text, re.M))
    assert documented == {s.key for s in SETTINGS}


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "tests/run.sh" in readme and "tests/run.sh" in ci


def test_configuration_doc_is_generated_from_the_table():
    from tools.config_docs import render

    text = (ROOT / "docs" / "configuration.md").read_text()
    assert text == render(), (
        "docs/configuration.md is stale: python -m tools.config_docs > it")


def test_gpu_verification_tables_are_rendered_from_committed_json():
    from tests.support.gpu_docs import DOC, render_blocks

    text = DOC.read_text()
    assert text == render_blocks(text), (
        "docs/gpu-verification.md differs from its JSON: python -m tests.support.gpu_docs")
