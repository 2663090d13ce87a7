"""vramscope: GPU memory observability for LLM inference servers.

The one name an inference server imports. It re-exports the in-server API from
``vramscope.hooks`` (and the records from ``vramscope.agent.records``) lazily, so
``import vramscope`` costs nothing until a name is used and works on a machine without torch or
a GPU::

    import vramscope

    report = vramscope.install()          # what is active, and why anything is not
    with vramscope.phase("prefill", request_id="r1"):
        ...
    pool = vramscope.KVBlockPool(num_layers=16, num_kv_heads=4, head_dim=128,
                                 dtype="bfloat16", num_blocks=1024, block_size=16)

The only top-level name vramscope installs: the hooks and the agent are its sub-packages
(``vramscope.hooks``, ``vramscope.agent``), so a user's own ``hooks.py`` or ``agent.py`` can
never shadow them (``tests/test_packaging.py`` checks it from an installed wheel).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

# Installed (wheel or editable), the sub-packages are found as vramscope.agent etc. In a source
# checkout used without installing (the repository root on sys.path, as GPU-machine scripts and
# `python tests/gpu/x.py` run), this folder holds only the facade while agent/, hooks/,
# dashboard/ and migrations/ sit beside it: look for sub-packages there too.
_CHECKOUT = Path(__file__).resolve().parent.parent
_INSTALLED_LAYOUT = (Path(__file__).parent / "hooks").is_dir()
if not _INSTALLED_LAYOUT and (_CHECKOUT / "hooks" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))  # noqa: F821 - a package's __path__

_EXPORTS: dict[str, str] = {
    "install": "vramscope.hooks.install",
    "uninstall": "vramscope.hooks.install",
    "InstallReport": "vramscope.hooks.install",
    "phase": "vramscope.hooks.phase",
    "set_phase": "vramscope.hooks.phase",
    "current_phase": "vramscope.hooks.phase",
    "KVBlockPool": "vramscope.hooks.kvpool",
    "KVPoolObserver": "vramscope.hooks.kvpool",
    "KVPoolError": "vramscope.hooks.kvpool",
    "attach_transformers": "vramscope.hooks.transformers_integration",
    # embedded mode composes from the agent side: importing it costs the agent, so only on use
    "install_embedded": "vramscope.agent.embedded",
    "Phase": "vramscope.agent.records",
    "Sample": "vramscope.agent.records",
    "Event": "vramscope.agent.records",
    "PostMortem": "vramscope.agent.records",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'vramscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
