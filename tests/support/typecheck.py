"""Run mypy over the installed names (``vramscope.hooks``, ``vramscope.agent``, ...).

The repository's folders install as ``vramscope.<folder>`` through a setuptools package-dir
mapping, and the editable install reaches them through an import hook that mypy cannot follow
(``mypy_path`` and ``explicit_package_bases`` map folders, they cannot rename them). So this builds
the installed layout out of symbolic links (under .mypy_cache/layout), ``vramscope/agent -> agent``
and so on, points MYPYPATH at it and checks the packages by their installed names. The checkout's
``tools`` (never installed) is linked beside them under its own name and checked the same way.
The settings (strictness, third-party stubs) are ``[tool.mypy]`` in pyproject.toml.

    python -m tests.support.typecheck            # exit status 0 when clean
    python -m tests.support.typecheck -- --no-incremental   # extra mypy arguments after --
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# installed name under vramscope -> repository folder (pyproject.toml [tool.setuptools.package-dir])
FOLDERS = {"agent": "agent", "hooks": "hooks", "dashboard": "dashboard", "migrations": "migrations"}
FACADE_FILES = ("__init__.py", "__main__.py", "py.typed")
# -p is recursive, so the facade goes in as modules and each folder as a package.
MODULES = ("vramscope", "vramscope.__main__")
PACKAGES = ("vramscope.hooks", "vramscope.agent", "vramscope.dashboard", "vramscope.migrations",
            "tools")


def build_tree(base: Path) -> Path:
    """Lay out ``base/vramscope`` as it is installed, out of links into the repository."""
    pkg = base / "vramscope"
    pkg.mkdir()
    for name in FACADE_FILES:
        (pkg / name).symlink_to(ROOT / "vramscope" / name)
    for name, folder in FOLDERS.items():
        (pkg / name).symlink_to(ROOT / folder, target_is_directory=True)
    (base / "tools").symlink_to(ROOT / "tools", target_is_directory=True)
    return base


def command(extra: list[str]) -> list[str]:
    args = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    for module in MODULES:
        args += ["-m", module]
    for package in PACKAGES:
        args += ["-p", package]
    return args + extra


def run(extra: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Type-check the packages; the result carries mypy's exit status and report."""
    # The layout sits at a fixed place beside mypy's cache: the cache remembers files by path, so
    # a fresh temporary directory per run would make it re-read (and misname) unchanged modules.
    base = ROOT / ".mypy_cache" / "layout"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    build_tree(base)
    env = dict(os.environ, MYPYPATH=str(base))
    result = subprocess.run(
        command(list(extra or [])), cwd=ROOT, env=env, capture_output=True, text=True
    )
    result.stdout = repository_paths(result.stdout, str(base))
    return result


def repository_paths(report: str, base: str) -> str:
    """Name files as they are in the repository (hooks/x.py), not by the links."""
    base = os.path.relpath(base, ROOT)
    for name, folder in FOLDERS.items():
        report = report.replace(f"{base}/vramscope/{name}/", f"{folder}/")
    report = report.replace(f"{base}/tools/", "tools/")
    return report.replace(f"{base}/vramscope/", "vramscope/")


def main(argv: list[str]) -> int:
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    result = run(extra)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
