"""What ``pip install vramscope`` puts on a machine: one top-level name, every file it needs.

The wheel is built once per session from a clean copy of the working tree (setuptools reuses a
``build/`` folder in the source tree, so a stale module there would end up in a wheel built in
place), then installed with ``pip --no-deps --no-index`` into a fresh virtual environment and
used from a working directory that holds a module named after each of our sub-packages.
"""

from __future__ import annotations

import ast
import contextlib
import os
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clean_copy import clean_copy

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
SHADOWS = ("agent", "hooks", "dashboard", "migrations")
# Modules that once shipped in the wheel and are the checkout's tooling now (tools/).
TOOLING = ("history_generator.py", "config_docs.py", "screenshots.py", "first_fit.py",
           "gpu_check.py", "agent_process.py")


def _run(*cmd: str | Path, cwd: Path | None = None, timeout: float = 300) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = clean_copy(tmp_path_factory.mktemp("src") / "vramscope")
    out = tmp_path_factory.mktemp("wheel")
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", out, src)
    [built] = out.glob("vramscope-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel_names(wheel) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    """A fresh virtual environment with the wheel and nothing else of ours; its python."""
    env = tmp_path_factory.mktemp("venv") / "env"
    _run(sys.executable, "-m", "venv", env)
    python = env / "bin" / "python"
    _run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel)
    return python


def _folder_packages() -> set[str]:
    """Installed package names of every folder with an ``__init__.py`` (package-dir mapped)."""
    found = set()
    for package, folder in SETUPTOOLS["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([package, *rel]))
    return found


def test_pyproject_packages_are_the_folders_with_an_init():
    assert sorted(SETUPTOOLS["packages"]) == sorted(_folder_packages())


def test_the_wheel_installs_one_top_level_name(wheel, wheel_names):
    tops = {name.split("/")[0] for name in wheel_names}
    [dist_info] = [t for t in tops if t.endswith(".dist-info")]
    assert tops - {dist_info} == {"vramscope"}
    with zipfile.ZipFile(wheel) as zf:  # what pip records as the distribution's top level
        top_level = f"{dist_info}/top_level.txt"
        if top_level in wheel_names:
            assert zf.read(top_level).decode().split() == ["vramscope"]


def test_the_wheel_is_the_product_without_its_tooling(wheel_names):
    """The benchmarks, the history generator, the docs and screenshot renderers are tools/ of
    the source checkout (tools/__init__.py): not a package of the wheel, none of it inside."""
    assert (ROOT / "tools" / "bench" / "__init__.py").is_file()
    assert "tools" not in SETUPTOOLS["package-dir"].values()
    assert sorted(p for p in SETUPTOOLS["packages"] if "bench" in p or "tools" in p) == []
    shipped = [n for n in wheel_names
               if "/bench/" in n or n.startswith("tools/") or n.rsplit("/", 1)[-1] in TOOLING]
    assert shipped == []


def _data_files() -> list[str]:
    """Non-Python files and migration scripts the code reads at run time, as wheel paths."""
    wanted = [*(ROOT / "migrations" / "versions").glob("*.py"),
              *(ROOT / "migrations").glob("*.mako"), ROOT / "migrations" / "env.py",
              *(ROOT / "dashboard" / "templates").iterdir(),
              *(ROOT / "dashboard" / "static").iterdir(), ROOT / "vramscope" / "py.typed"]
    names = []
    for path in wanted:
        rel = path.relative_to(ROOT)
        package = {"migrations": "vramscope/migrations", "dashboard": "vramscope/dashboard",
                   "vramscope": "vramscope"}[rel.parts[0]]
        names.append("/".join([package, *rel.parts[1:]]))
    return sorted(names)


def test_the_wheel_holds_the_migrations_templates_and_static_files(wheel_names):
    assert len(_data_files()) > 15
    assert sorted(set(_data_files()) - set(wheel_names)) == []


def test_the_wheel_holds_every_module_of_every_package(wheel_names):
    modules = set()
    for package, folder in SETUPTOOLS["package-dir"].items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder)
            if ".".join([package, *rel.parent.parts]) in SETUPTOOLS["packages"]:
                modules.add("/".join([*package.split("."), *rel.parts]))
    assert sorted(modules - set(wheel_names)) == []
    stray = {n for n in wheel_names if n.endswith(".py")} - modules - set(_data_files())
    assert sorted(stray) == []  # nothing that is not in the source tree (a stale build/)


def _shadowed_dir(tmp_path: Path) -> Path:
    """A server's working directory with a module named after each of our sub-packages."""
    for name in SHADOWS:
        (tmp_path / f"{name}.py").write_text(
            f"raise ImportError('the user module {name}.py was imported instead of ours')\n")
    return tmp_path


INSTALL_SCRIPT = """
import sys

import vramscope

class Sink:
    def __init__(self):
        self.records = []
    def put(self, record):
        self.records.append(record)
    def close(self):
        pass

sink = Sink()
r = vramscope.install(sink=sink)
print(r)
vramscope.set_phase("decode")
print("records:", [(x.name, x.phase.value) for x in sink.records])
print("from:", vramscope.__file__)
print("agent modules:", sorted(m for m in sys.modules if m.startswith("vramscope.agent")))
vramscope.uninstall()
"""


def test_install_from_the_wheel_beside_modules_named_agent_hooks_dashboard_migrations(
        venv, tmp_path):
    cwd = _shadowed_dir(tmp_path)
    out = _run(venv, "-c", INSTALL_SCRIPT, cwd=cwd)  # -c puts the working directory first
    assert "vramscope: on  sink: given: Sink" in out
    assert "vramscope: off allocator: torch is not importable" in out  # no torch in that venv
    assert "records: [('phase', 'decode')]" in out
    site = Path(_run(venv, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     cwd=cwd).strip())
    assert f"from: {site / 'vramscope' / '__init__.py'}" in out
    # what a server loads of the agent is the shared core (tests/test_import_graph.py's CORE)
    loaded = out.split("agent modules: ", 1)[1].splitlines()[0]
    assert "vramscope.agent.records" in ast.literal_eval(loaded)
    assert set(ast.literal_eval(loaded)) <= {
        "vramscope.agent", "vramscope.agent.ingest", "vramscope.agent.records",
        "vramscope.agent.trace", "vramscope.agent.ingest.protocol", "vramscope.agent.clock",
        "vramscope.agent.errors", "vramscope.agent.config", "vramscope.agent.settings",
        "vramscope.agent.database_url", "vramscope.agent.dtypes"}


@contextlib.contextmanager
def _borrowed_dependencies(venv: Path) -> Iterator[Path]:
    """The wheel's venv borrows this interpreter's dependencies (SQLAlchemy, Alembic) through a
    .pth line, which adds the folder without running its .pth files, so the editable install of
    the checkout stays out and ``vramscope`` is the wheel's. Yields the venv's site-packages."""
    site = Path(_run(venv, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"
                     ).strip())
    (site / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    try:
        yield site
    finally:
        (site / "zz_test_deps.pth").unlink()


def test_db_upgrade_from_the_installed_wheel(venv, tmp_path):
    """The installed package finds its Alembic scripts: ``vramscope db upgrade`` on a temporary
    SQLite file."""
    with _borrowed_dependencies(venv) as site:
        cwd = _shadowed_dir(tmp_path)
        db = tmp_path / "fresh.db"
        _run(venv, "-m", "vramscope", "db", "upgrade", "--db", f"sqlite:///{db}", cwd=cwd)
        out = _run(venv, "-c", "import vramscope.migrations as m, sqlalchemy as sa; "
                               f"e = sa.create_engine('sqlite:///{db}'); "
                               "print(m.__file__); print(sorted(sa.inspect(e).get_table_names()))",
                   cwd=cwd)
    where, tables = out.splitlines()
    assert where == str(site / "vramscope" / "migrations" / "__init__.py")
    assert "'alembic_version'" in tables and "'samples'" in tables and "'devices'" in tables


def test_bench_from_the_installed_wheel_says_it_runs_from_a_checkout(venv, tmp_path):
    """The benchmarks are not in the wheel: ``vramscope bench`` says where they run, exit 2."""
    with _borrowed_dependencies(venv):
        done = subprocess.run([str(venv), "-m", "vramscope", "bench", "ingest", "--quick"],
                              cwd=_shadowed_dir(tmp_path), capture_output=True, text=True,
                              timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("vramscope: error: vramscope bench runs from a source checkout (git "
                           "clone, then pip install -e .): this installation has no "
                           "tools/bench/\n")
