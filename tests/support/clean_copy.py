"""A clean copy of the working tree, as a fresh clone would be: setuptools reuses a ``build/``
folder in the source tree, so a stale module there would end up in a wheel built in place
(tests/test_packaging.py, tests/test_deploy_install.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What a clean copy leaves out: VCS, environments, caches and earlier builds.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__",
                                    ".*_cache", ".hypothesis", "out", ".whl", "*.db*")


def clean_copy(dest: Path) -> Path:
    """The working tree copied to ``dest`` without what a clone would not have; ``dest``."""
    shutil.copytree(ROOT, dest, ignore=NOT_SOURCE)
    return dest
