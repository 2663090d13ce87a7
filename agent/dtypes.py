"""Bytes per element of the dtypes vramscope knows by name: the one table.

The KV block pool (``vramscope.hooks.kvpool``) sizes its blocks with it without importing torch,
and the estimator (``vramscope.agent.estimate``) sizes weights and KV caches. It is part of the
small core the hooks may import (docs/architecture.md, "Direction of imports"), so it imports
nothing. Packed 4-bit formats are half a byte per element.
"""

from __future__ import annotations

DTYPE_BYTES: dict[str, float] = {
    "float64": 8, "double": 8,
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
    "float8": 1, "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1,
    "int4": 0.5, "fp4": 0.5, "nvfp4": 0.5,
}


def dtype_key(name: str) -> str:
    """``"torch.BFloat16"`` -> ``"bfloat16"``: how a name is looked up."""
    return str(name).lower().removeprefix("torch.")


def element_bytes(name: str) -> float | None:
    """Bytes per element of ``name`` (any case, with or without ``torch.``), or None."""
    return DTYPE_BYTES.get(dtype_key(name))


def known_dtypes() -> str:
    """The known names, for an error message."""
    return ", ".join(sorted(DTYPE_BYTES))
