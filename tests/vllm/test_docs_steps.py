"""docs/vllm.md's set-up steps run as written (issue 33): the ``sh`` block of "The plugin inside
vLLM", line by line, in a fresh virtual environment that sees vLLM's packages (the user's vLLM
environment: ``.venv-vllm``'s site-packages through a ``.pth``, without vramscope, which the
block installs from the checkout), then one completion reaches the database under the server's
name. Substituted, and only these: the model (the tiny test model, with the CPU build's
small-model flags), the port (a free one) and ``/tmp/vramscope`` (a fresh folder).
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
from tests.vllm.test_serve_prometheus import _free_port, _get

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "vllm.md"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def docs_block() -> list[str]:
    """The commands of the first ``sh`` block under "## The plugin inside vLLM"."""
    text = DOC.read_text(encoding="utf-8").split("## The plugin inside vLLM", 1)[1]
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith(" ")]


def test_the_block_is_the_one_users_read():
    lines = docs_block()
    assert lines[0].startswith("pip install ./vramscope")
    assert lines[-1].startswith("python -m vllm.entrypoints.openai.api_server --model ")


def test_the_docs_steps_run_as_written(model_dir, tmp_path):
    from vramscope.agent.store import Store

    root = Path(tempfile.mkdtemp(prefix="vs-doc-", dir="/tmp"))  # AF_UNIX: a short path
    port = _free_port()
    work = tmp_path / "work"
    work.mkdir()
    (work / "vramscope").symlink_to(REPO)  # `pip install ./vramscope`: the checkout
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(fresh)], check=True)
    site = next(fresh.glob("lib/python*/site-packages"))
    (site / "vllm-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    lines = [line.replace("/tmp/vramscope", str(root)) for line in docs_block()]
    lines[-1] = (lines[-1].replace(MODEL, model_dir).replace("--port 8000", f"--port {port}")
                 + " --host 127.0.0.1 --max-model-len 256 --enforce-eager --dtype bfloat16")
    script = "set -ex\nmkdir -p " + str(root) + "\n" + "\n".join(lines) + "\n"
    env = {**os.environ, "PATH": f"{fresh / 'bin'}:{os.environ['PATH']}",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VIRTUAL_ENV": str(fresh)}
    env.pop("PYTHONPATH", None)  # nothing of the checkout but what the block installs
    log = open(tmp_path / "steps.log", "w", encoding="utf-8")  # noqa: SIM115 - read below
    proc = subprocess.Popen(["bash", "-c", script], cwd=work, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(base, proc, tmp_path / "steps.log"), timeout_s=600, poll_s=1.0)
        assert _complete_model(base, model_dir) == 8
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
        shutil.rmtree(root, ignore_errors=True)
    text = (tmp_path / "steps.log").read_text(encoding="utf-8")
    installed = Path(re.search(r"^(\S+)$", subprocess.run(
        [str(fresh / "bin" / "python"), "-c", "import vramscope; print(vramscope.__file__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout,
        re.M).group(1))
    assert installed.is_relative_to(site), installed  # the block's install, not the checkout's
    assert f"vllm engine core (port {port})" in names, (names, text[-3000:])


def _complete_model(base: str, model: str) -> int:
    import json
    import urllib.request

    body = json.dumps({"model": model, "prompt": list(range(3, 13)), "max_tokens": 8,
                       "ignore_eos": True, "temperature": 0}).encode()
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
