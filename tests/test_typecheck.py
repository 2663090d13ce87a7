"""The type checker's set-up: the layout it checks is the installed one, and the code passes.

``tests/run.sh`` runs ``python -m tests.support.typecheck`` itself (once, before pytest); the
full check here is ``slow`` so the suite does not pay for it twice.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support import typecheck

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the CI Python is newer
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_checked_layout_is_the_installed_one():
    """Every folder pyproject maps into ``vramscope`` is linked under its installed name, so a
    new top-level folder cannot slip past the checker."""
    mapping = _pyproject()["tool"]["setuptools"]["package-dir"]
    expected = {name.removeprefix("vramscope."): folder for name, folder in mapping.items()
                if name != "vramscope"}
    assert expected == typecheck.FOLDERS


def test_the_tree_links_each_folder_under_vramscope(tmp_path):
    typecheck.build_tree(tmp_path)
    pkg = tmp_path / "vramscope"
    assert (pkg / "hooks" / "sampler.py").resolve() == ROOT / "hooks" / "sampler.py"
    assert (pkg / "agent" / "daemon.py").resolve() == ROOT / "agent" / "daemon.py"
    assert (pkg / "__init__.py").resolve() == ROOT / "vramscope" / "__init__.py"
    # the checkout's tooling is checked too, under its own name (it is never installed)
    tables = Path("tools", "bench", "tables.py")
    assert (tmp_path / tables).resolve() == ROOT / tables
    assert "tools" in typecheck.PACKAGES


def test_report_paths_name_repository_files():
    base = str(ROOT / ".mypy_cache" / "layout")
    report = (".mypy_cache/layout/vramscope/hooks/sampler.py:3: error: x\n"
              ".mypy_cache/layout/vramscope/__init__.py:1: error: y\n"
              ".mypy_cache/layout/tools/bench/fleet.py:2: error: z\n")
    assert typecheck.repository_paths(report, base) == (
        "hooks/sampler.py:3: error: x\nvramscope/__init__.py:1: error: y\n"
        "tools/bench/fleet.py:2: error: z\n")


def test_our_own_code_is_checked_strictly():
    """Strictness comes from the top-level setting; no override may switch off a strict flag
    for hooks (the in-server code)."""
    mypy = _pyproject()["tool"]["mypy"]
    assert mypy["strict"] is True
    for override in mypy.get("overrides", []):
        modules = override["module"] if isinstance(override["module"], list) else [
            override["module"]]
        assert not any(m.startswith("vramscope.hooks") for m in modules), override


@pytest.mark.slow
def test_mypy_is_clean():
    result = typecheck.run()
    assert result.returncode == 0, result.stdout + result.stderr
