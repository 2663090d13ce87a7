"""``config check`` and the agent agree on every database URL (issue 45, item 7): one validator
(:func:`~vramscope.agent.database_url.database_url_problem`, then the driver's
:func:`~vramscope.agent.database_url.database_driver_problem`) refuses what the store cannot
open, in the same words, and its hint names the extra that installs the missing driver, or
none."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vramscope.agent.cli import main
from vramscope.agent.database_url import database_driver_problem, database_url_problem
from vramscope.agent.errors import StoreError
from vramscope.agent.store import Store

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": str(folder),
           "XDG_RUNTIME_DIR": str(folder), "XDG_DATA_HOME": str(folder)}
    env.pop("VRAMSCOPE_DATABASE_URL", None)
    return subprocess.run([sys.executable, "-m", "vramscope", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("url", "problem"), [
    ("mysql://x", "'mysql' is not a database vramscope stores to"),
    ("postgresql+pg8000://h/db", "needs the 'pg8000' driver (postgresql+pg8000), which is not "
                                 "installed and which no vramscope extra installs"),
])
def test_config_check_refuses_what_the_agent_refuses_in_its_words(tmp_path, url, problem):
    config = tmp_path / "vramscope.toml"
    config.write_text(f'[database]\nurl = "{url}"\n')
    check = _run(["config", "check", str(config)], tmp_path)
    agent = _run(["agent", "--config", str(config), "--no-nvml", "--socket",
                  str(tmp_path / "a.sock")], tmp_path)
    assert check.returncode == 1 and agent.returncode == 1, (check.stdout, agent.stderr)
    said = f"{config}: database.url = {url!r}: {problem}"
    assert said in check.stderr
    assert said in agent.stderr


def test_a_url_no_extra_serves_is_not_sent_to_the_postgres_extra():
    # the old hint sent every missing driver to 'vramscope[postgres]', which installs none but
    # psycopg 3
    with pytest.raises(StoreError) as err:
        Store.open("mysql://x")
    assert "MySQLdb" not in str(err.value)  # no driver to install: MySQL is not served
    with pytest.raises(StoreError) as err:
        Store.open("postgresql+pg8000://h/db")
    assert "which no vramscope extra installs: pip install pg8000, or" in str(err.value)


def test_a_missing_psycopg_names_the_postgres_extra(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "psycopg" else real(name, *a))
    url = "postgresql+psycopg://h/db"
    hint = ("needs the 'psycopg' driver, which is not installed: pip install "
            "'psycopg[binary]>=3.1' into vramscope's environment (its 'postgres' extra, "
            "docs/deployment.md)")
    assert database_driver_problem(url) == hint
    with pytest.raises(StoreError, match="its 'postgres' extra, docs/deployment.md\\)$"):
        Store.open(url)
    config = tmp_path / "vramscope.toml"
    config.write_text(f'[database]\nurl = "{url}"\n')
    assert main(["config", "check", str(config)]) == 1
    assert hint in capsys.readouterr().err


@pytest.mark.parametrize("url", ["sqlite:///x.db", "sqlite+pysqlite:///x.db",
                                 "postgresql+psycopg://u:p@h/db"])
def test_the_urls_vramscope_serves_pass(url):
    assert database_url_problem(url) is None
    assert database_driver_problem(url) is None


def test_the_hints_name_what_the_extras_of_pyproject_install():
    """The hints name the requirement, not ``vramscope[extra]`` (on no package index)."""
    from vramscope.agent.database_url import DATABASE_DRIVERS, EXTRA_REQUIREMENTS

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    named = {extra for _, extra in DATABASE_DRIVERS.values() if extra is not None}
    assert named == set(EXTRA_REQUIREMENTS) == {"postgres"}
    assert [EXTRA_REQUIREMENTS["postgres"]] == extras["postgres"]
