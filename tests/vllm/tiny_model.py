"""The tiny random-weight Llama folder the vLLM tests load (built by the benchmark's builder,
so ``vramscope bench vllm`` and the tests run the same model)."""

from __future__ import annotations

from pathlib import Path


def build(path: str | Path) -> Path:
    from tools.bench.vllm import build_tiny_llama

    return build_tiny_llama(path)
