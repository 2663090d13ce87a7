"""Random-weight Llamas and continuous-batching configs for the GPU scripts, robust to the
transformers on the GPU machine (5.17) and the current one (5.24).

- 5.17 keeps SDPA only when the attention implementation is already paged (``paged|sdpa``);
  5.24 drops the prefix and takes ``auto_switch_to_flash=False`` instead (either would
  otherwise look for flash attention kernels on the hub, and the GPU machine has no network);
- 5.24 renamed ``block_size`` to ``page_size``;
- ``generate_batch`` keyword arguments are passed only when its signature has them.
"""

from __future__ import annotations

import inspect
import random
from typing import Any


def llama(layers: int, hidden: int, *, heads: int | None = None, kv_heads: int = 4,
          vocab: int = 32000, device: str = "cuda", seed: int = 0) -> Any:
    """A random-weight Llama in bf16 from a config (no hub, no download), in eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    heads = heads or max(kv_heads, hidden // 128)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=4096)
    model = LlamaForCausalLM(config).to(device, torch.bfloat16).eval()
    model.set_attn_implementation("sdpa" if _new_cb_config() else "paged|sdpa")
    return model


def _new_cb_config() -> bool:
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    return "auto_switch_to_flash" in inspect.signature(ContinuousBatchingConfig).parameters


def cb_config(num_blocks: int | None, max_batch_tokens: int | None, page: int = 16) -> Any:
    """A ``ContinuousBatchingConfig``; ``num_blocks=None`` lets transformers size the pool from
    the free memory (its default: most of the GPU)."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    params = inspect.signature(ContinuousBatchingConfig).parameters
    kwargs: dict[str, Any] = {"page_size" if "page_size" in params else "block_size": page}
    if num_blocks is not None:
        kwargs["num_blocks"] = num_blocks
    if max_batch_tokens is not None:
        kwargs["max_batch_tokens"] = max_batch_tokens
    if _new_cb_config():
        kwargs["auto_switch_to_flash"] = False
    return ContinuousBatchingConfig(**kwargs)


def prompts(n: int, length: int, vocab: int = 32000, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(length)] for _ in range(n)]


def generate_batch(model: Any, requests: list[list[int]], new_tokens: int, cb: Any) -> Any:
    """``model.generate_batch`` with exactly ``new_tokens`` tokens per request (no EOS)."""
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1,
                           pad_token_id=0)
    accepted = inspect.signature(model.generate_batch).parameters
    extra = {k: v for k, v in {"continuous_batching_config": cb, "progress_bar": False}.items()
             if k in accepted or any(p.kind is p.VAR_KEYWORD for p in accepted.values())}
    out = model.generate_batch(requests, generation_config=gen, **extra)
    if len(out) != len(requests):
        raise RuntimeError(f"generate_batch returned {len(out)} results for {len(requests)} "
                           "requests")
    return out


def record_pool_sizes() -> tuple[list[int], Any]:
    """Each new ``PagedAttentionCache``'s ``num_blocks`` (an int, nothing else kept), and the
    undo. Installed for both halves of an A/B alike, so it biases neither."""
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    sizes: list[int] = []
    original = PagedAttentionCache.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        sizes.append(int(getattr(self, "num_blocks", -1)))

    PagedAttentionCache.__init__ = __init__

    def undo() -> None:
        PagedAttentionCache.__init__ = original
    return sizes, undo


def alive(class_name: str) -> int:
    """Objects of a class named ``class_name`` alive after a full collection."""
    import gc

    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o).__name__ == class_name)


def versions() -> dict[str, str]:
    import sys

    import torch
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_name(0)
    return out
