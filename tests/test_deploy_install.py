"""docs/deployment.md, "Installing vramscope on a node", run as written: the wheel built from a
clean copy of the clone, installed with the ``postgres`` extra into a fresh virtual environment
(its dependencies from the package index, as on a node), its ``vramscope`` run; then that
command upgrades a real PostgreSQL database (the extra's driver), and the unit, the container
image and the pod start the command the block installs.

Only what a node has no use for is changed: ``sudo`` dropped, and ``/opt/vramscope`` a
temporary folder. The steps run with the project's own environment off ``PATH``, as a new
user's shell would be.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from vramscope.agent.settings import SETTINGS

from tests.support.clean_copy import ROOT, clean_copy
from tests.test_deploy import AGENT_COMMAND, UNIT, one, parse_unit

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

DOC = ROOT / "docs" / "deployment.md"
STEPS = re.search(r"<!-- install-steps[^>]*-->\n```sh\n(.*?)```", DOC.read_text(), re.S)
if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _new_user_env() -> dict[str, str]:
    """This environment without the project's virtual environment and source on the paths."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not Path(p).resolve().is_relative_to(ROOT))
    return env


def test_the_install_steps_run_as_written_and_are_what_the_unit_starts(tmp_path, postgres_url):
    assert STEPS is not None, "docs/deployment.md lost its install-steps block"
    venv = re.search(r"python3 -m venv (\S+)", STEPS.group(1))
    assert venv is not None
    installed = Path(venv.group(1))
    assert f"{installed}/bin/vramscope" == AGENT_COMMAND  # the unit's, the image's, the pod's
    assert one(parse_unit(UNIT.read_text())["Service"], "ExecStart").split()[0] == AGENT_COMMAND

    node = tmp_path / "node-venv"
    script = STEPS.group(1).replace(str(installed), str(node)).replace("sudo ", "")
    clone = clean_copy(tmp_path / "clone")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=clone,
                          capture_output=True, text=True, timeout=600, env=_new_user_env())
    assert done.returncode == 0, done.stdout + done.stderr
    version, check = done.stdout.splitlines()[-2:]
    assert version == f"vramscope {VERSION}"
    assert check.startswith(f"deploy/systemd/vramscope.toml: ok ({len(SETTINGS)} settings, ")
    [wheel] = (clone / "dist").glob("vramscope-*.whl")
    assert wheel.name == f"vramscope-{VERSION}-py3-none-any.whl"

    # the installed command is the wheel's, in its own environment, with the PostgreSQL driver
    command = node / "bin" / "vramscope"
    where = subprocess.run(
        [node / "bin" / "python", "-c", "import vramscope, psycopg; print(vramscope.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, env=_new_user_env())
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(node)
    upgraded = subprocess.run([command, "db", "upgrade", "--db", postgres_url], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, env=_new_user_env())
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    current = subprocess.run([command, "db", "current", "--db", postgres_url], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60, env=_new_user_env())
    heads = sorted(p.name.split("_", 1)[0] for p in (ROOT / "migrations" / "versions").glob(
        "[0-9]*.py"))
    assert current.returncode == 0 and heads[-1] in current.stdout, current.stdout
