"""A vLLM server's processes are named with its API port (issue 33 item 8): two servers on one
host, both "GPU 0" on CPU hosts, are told apart on every page. The engine core and workers are
multiprocessing children that keep the server's ``sys.argv``."""

from __future__ import annotations

import pytest
from vramscope.hooks.vllm_reads import with_port

API = "/venv/lib/python3.11/site-packages/vllm/entrypoints/openai/api_server.py"


@pytest.mark.parametrize(("argv", "name"), [
    ([API, "--model", "m", "--port", "8001"], "vllm engine core (port 8001)"),
    ([API, "--model", "m", "--port=9000"], "vllm engine core (port 9000)"),
    ([API, "--model", "m"], "vllm engine core (port 8000)"),  # vLLM's default
    (["/venv/bin/vllm", "serve", "m"], "vllm engine core (port 8000)"),
    (["tests/vllm/engine_run.py", "m", "out.json"], "vllm engine core"),  # offline LLM()
    ([API, "--port", "eighty"], "vllm engine core"),  # not a port: left out
])
def test_the_api_port_names_the_process(argv, name):
    assert with_port("vllm engine core", argv) == name
