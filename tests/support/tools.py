"""System tools some tests run (promtool, systemd-analyze, Chromium): skipped where missing on a
developer's machine, a failure under ``CI=true``, where ``tests/run.sh`` installs every one of
them, so a missing tool is a broken set-up and not a reason to pass with tests unrun."""

from __future__ import annotations

import os
import shutil

import pytest

# How to get each tool on Debian/Ubuntu (what tests/run.sh installs).
INSTALL = {
    "promtool": "apt-get install prometheus",
    "systemd-analyze": "apt-get install systemd",
    "chromium": "apt-get install chromium",
    "chromedriver": "apt-get install chromium-driver",
}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def tool_missing(what: str, hint: str) -> None:
    """Skip the test, or fail it under CI=true; never returns."""
    message = f"{what} not installed ({hint})"
    if in_ci():
        pytest.fail(f"{message}; CI=true runs every test: tests/run.sh installs it",
                    pytrace=False)
    pytest.skip(message)


def require_tool(name: str) -> str:
    """The path of ``name`` on PATH; else :func:`tool_missing`."""
    path = shutil.which(name)
    if path is None:
        tool_missing(name, INSTALL.get(name, f"install {name}"))
    return path
