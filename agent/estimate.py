"""The capacity planner behind ``vramscope estimate`` and the dashboard's Capacity page.

Given a model's shape (from a Hugging Face ``config.json`` or explicit numbers) and a serving
plan (context length, concurrency, KV dtype), it adds up what an inference server holds on the
GPU::

    weights      = parameters × bytes per weight
    overhead     = CUDA context, cuBLAS/NCCL workspaces, allocator slack (a flat allowance)
    KV cache     = 2 × layers × KV heads × head dim × tokens × concurrency × bytes per element
    activations  = prefill_tokens × (4 × hidden + 2 × intermediate) × bytes
                   + concurrency × vocab × 4                       (fp32 logits of one step)

and compares the total with the GPU's memory less a safety margin; it also solves for the
largest concurrency at the given context and the largest context at the given concurrency, and
sizes a paged KV pool in blocks of ``block_size`` tokens. The activation term is an allowance
for the prefill peak, not an exact figure; compare it with the measured prefill spike.
Pure functions, no I/O except :func:`load_hf_config`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vramscope.agent.dtypes import element_bytes, known_dtypes
from vramscope.agent.errors import UsageError

GiB = 1 << 30
MiB = 1 << 20


# Device memory as nvidia-smi / NVML report it (MiB), for --gpu NAME.
GPU_MEMORY_MIB: dict[str, int] = {
    "H200": 143771, "H100": 81559, "A100-80GB": 81920, "A100-40GB": 40960, "L40S": 46068,
    "A10G": 23028, "L4": 23034, "RTX4090": 24564, "T4": 15360,
}

# Common open models by name (``vramscope estimate --model llama-3-8b``): the shape keys of
# their published Hugging Face config.json, the Instruct release's where it differs (Qwen2.5:
# 32,768 positions). Counted from these shapes the parameters are the published ones:
# Llama-3-8B 8,030,261,248, Llama-3-70B 70,553,706,496, Mistral-7B-v0.3 7,248,023,552,
# Mixtral-8x7B 46,702,792,704; Qwen2.5 7.62 B and 72.71 B (its q, k, v biases left out).
_LLAMA3_8B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
              "vocab_size": 128256, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
_LLAMA3_70B = {**_LLAMA3_8B, "num_hidden_layers": 80, "hidden_size": 8192,
               "num_attention_heads": 64, "intermediate_size": 28672}
_MISTRAL_7B = {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
               "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
               "vocab_size": 32768, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
               "max_position_embeddings": 32768}
_QWEN25_7B = {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
              "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
              "vocab_size": 152064, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
              "max_position_embeddings": 32768}
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-3-8b": ("meta-llama/Meta-Llama-3-8B", {**_LLAMA3_8B,
                                                  "max_position_embeddings": 8192}),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B", {**_LLAMA3_8B,
                                                 "max_position_embeddings": 131072}),
    "llama-3-70b": ("meta-llama/Meta-Llama-3-70B", {**_LLAMA3_70B,
                                                    "max_position_embeddings": 8192}),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B", {**_LLAMA3_70B,
                                                   "max_position_embeddings": 131072}),
    "mistral-7b": ("mistralai/Mistral-7B-Instruct-v0.3", _MISTRAL_7B),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-Instruct-v0.1", {
        **_MISTRAL_7B, "model_type": "mixtral", "vocab_size": 32000, "num_local_experts": 8,
        "num_experts_per_tok": 2}),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", _QWEN25_7B),
    "qwen2.5-72b": ("Qwen/Qwen2.5-72B-Instruct", {
        **_QWEN25_7B, "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
        "num_key_value_heads": 8, "intermediate_size": 29568}),
}


def preset(name: str) -> tuple[str, dict[str, Any]]:
    """``(Hugging Face id, config)`` of a known model, by its preset name or its id (any
    case)."""
    wanted = name.strip().lower()
    for key, (hf_id, cfg) in PRESETS.items():
        if wanted in (key, hf_id.lower()):
            return hf_id, dict(cfg)
    raise UsageError(f"unknown model {name!r}; known: {', '.join(PRESETS)} (or give its "
                     f"config.json)")


# Gated MLPs (gate, up, down) have three matrices; GPT-style MLPs two.
_GATED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2",
                      "phi3", "olmo", "granite")


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    num_params: int
    dtype: str = "bfloat16"
    intermediate_size: int = 0
    vocab_size: int = 0
    max_position_embeddings: int | None = None
    name: str = "model"

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "num_kv_heads", "head_dim", "hidden_size", "num_params"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value <= 0:
                raise UsageError(f"model shape: {field_name} must be a positive integer, "
                                 f"got {value!r}")
        dtype_bytes(self.dtype)

    def kv_bytes_per_token(self, kv_dtype: str | None = None) -> int:
        """2 (K and V) × layers × KV heads × head dim × bytes per element."""
        per = dtype_bytes(kv_dtype or self.dtype)
        return int(2 * self.num_layers * self.num_kv_heads * self.head_dim * per)


def dtype_bytes(name: str) -> float:
    size = element_bytes(name)
    if size is None:
        raise UsageError(f"unknown dtype {name!r}; known: {known_dtypes()}")
    return size


def load_hf_config(path: str | Path) -> dict[str, Any]:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable JSON config: {exc}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def shape_from_hf_config(cfg: dict[str, Any], name: str = "model") -> ModelShape:
    """A :class:`ModelShape` from a transformers ``config.json`` dict (text part if nested)."""
    cfg = cfg.get("text_config") or cfg
    layers = _key(cfg, name, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _key(cfg, name, "hidden_size", "n_embd", "d_model")
    heads = _key(cfg, name, "num_attention_heads", "n_head")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    inter = cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * hidden
    vocab = cfg.get("vocab_size") or 0
    params = cfg.get("num_parameters") or count_parameters(
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        intermediate=inter, vocab=vocab, gated=cfg.get("model_type") in _GATED_MODEL_TYPES,
        tied=bool(cfg.get("tie_word_embeddings", False)),
        experts=int(cfg.get("num_local_experts") or 1))
    return ModelShape(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim,
                      hidden_size=hidden, num_params=params, dtype=str(dtype),
                      intermediate_size=inter, vocab_size=vocab,
                      max_position_embeddings=cfg.get("max_position_embeddings"), name=name)


def _key(cfg: dict[str, Any], name: str, *keys: str) -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and value > 0:
            return value
    raise UsageError(f"{name}: config has no positive integer {' / '.join(keys)}")


def count_parameters(*, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                     intermediate: int, vocab: int, gated: bool = True, tied: bool = False,
                     experts: int = 1) -> int:
    """Parameters of a decoder-only transformer from its shape (biases ignored). A mixture of
    experts (``num_local_experts``: Mixtral) holds every expert's MLP and a router; all of
    them are in memory, whichever two a token uses."""
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o and k, v projections
    mlp = (3 if gated else 2) * hidden * intermediate * experts
    if experts > 1:
        mlp += hidden * experts  # the router
    per_layer = attention + mlp + 2 * hidden  # two norms
    embeddings = vocab * hidden * (1 if tied else 2)  # input embedding and LM head
    return layers * per_layer + embeddings + hidden  # final norm


@dataclass(frozen=True)
class Plan:
    context_tokens: int
    concurrency: int
    gpu_memory_bytes: int
    kv_dtype: str | None = None  # None: the model's dtype
    weight_dtype: str | None = None  # None: the model's dtype (e.g. "int4" for AWQ/GPTQ)
    overhead_bytes: int = 1 * GiB
    margin_ratio: float = 0.10
    block_size_tokens: int = 16
    prefill_tokens: int | None = None  # None: one whole prompt of context_tokens (no chunking)

    def __post_init__(self) -> None:
        for name in ("context_tokens", "concurrency", "gpu_memory_bytes", "block_size_tokens"):
            if getattr(self, name) <= 0:
                raise UsageError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.margin_ratio < 1:
            raise UsageError(f"margin must be in [0, 1), got {self.margin_ratio}")
        if self.overhead_bytes < 0:
            raise UsageError(f"overhead must be >= 0, got {self.overhead_bytes}")


@dataclass(frozen=True)
class Estimate:
    model: str
    weights_bytes: int
    overhead_bytes: int
    kv_bytes_per_token: int
    kv_cache_bytes: int
    activation_bytes: int
    total_bytes: int
    gpu_memory_bytes: int
    usable_bytes: int  # after the safety margin
    fits: bool
    headroom_bytes: int  # usable − total (negative when it does not fit)
    max_concurrency: int  # at context_tokens
    max_context_tokens: int  # at concurrency
    block_size_tokens: int
    block_bytes: int
    pool_blocks: int  # a paged pool filling the KV budget
    blocks_needed: int  # concurrency × ceil(context / block size)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def estimate(shape: ModelShape, plan: Plan) -> Estimate:
    weights = int(shape.num_params * dtype_bytes(plan.weight_dtype or shape.dtype))
    per_token = shape.kv_bytes_per_token(plan.kv_dtype)
    kv = per_token * plan.context_tokens * plan.concurrency
    activations = activation_bytes(shape, plan)
    total = weights + plan.overhead_bytes + kv + activations
    usable = int(plan.gpu_memory_bytes * (1 - plan.margin_ratio))
    kv_budget = max(0, usable - weights - plan.overhead_bytes - activations)
    block_bytes = per_token * plan.block_size_tokens
    return Estimate(
        model=shape.name, weights_bytes=weights, overhead_bytes=plan.overhead_bytes,
        kv_bytes_per_token=per_token, kv_cache_bytes=kv, activation_bytes=activations,
        total_bytes=total, gpu_memory_bytes=plan.gpu_memory_bytes, usable_bytes=usable,
        fits=total <= usable, headroom_bytes=usable - total,
        max_concurrency=kv_budget // (per_token * plan.context_tokens),
        max_context_tokens=largest_context(shape, plan, usable - weights - plan.overhead_bytes),
        block_size_tokens=plan.block_size_tokens, block_bytes=block_bytes,
        pool_blocks=kv_budget // block_bytes,
        blocks_needed=plan.concurrency * -(-plan.context_tokens // plan.block_size_tokens))


def largest_context(shape: ModelShape, plan: Plan, budget_bytes: int) -> int:
    """The longest context that fits ``budget_bytes`` (usable memory less weights and overhead)
    at the plan's concurrency. Without a prefill cap the prompt is prefilled whole, so the
    activation allowance grows with the context too: a longer context costs KV *and* a larger
    prefill peak (the plan's own context's allowance would overstate what is left)."""
    logits = plan.concurrency * shape.vocab_size * 4
    kv_per_token = shape.kv_bytes_per_token(plan.kv_dtype) * plan.concurrency
    if plan.prefill_tokens:  # chunked prefill: the peak does not grow with the context
        return max(0, budget_bytes - activation_bytes(shape, plan)) // kv_per_token
    return max(0, budget_bytes - logits) // (kv_per_token + _activation_bytes_per_token(shape))


def _activation_bytes_per_token(shape: ModelShape) -> int:
    inter = shape.intermediate_size or 4 * shape.hidden_size
    return int((4 * shape.hidden_size + 2 * inter) * dtype_bytes(shape.dtype))


def activation_bytes(shape: ModelShape, plan: Plan) -> int:
    """An allowance for the prefill peak: one layer's hidden and MLP temporaries over the
    prefill tokens, plus one step's fp32 logits for every sequence."""
    tokens = plan.prefill_tokens or plan.context_tokens
    return tokens * _activation_bytes_per_token(shape) + plan.concurrency * shape.vocab_size * 4


def gpu_memory_bytes(name: str) -> int:
    key = name.upper().replace(" ", "").replace("_", "-")
    if key not in GPU_MEMORY_MIB:
        raise UsageError(f"unknown GPU {name!r}; known: {', '.join(GPU_MEMORY_MIB)} "
                         "(or give --gpu-memory-gib)")
    return GPU_MEMORY_MIB[key] * MiB


# --- the OOM a configuration makes possible ---------------------------------------------------
@dataclass(frozen=True)
class Admission:
    """What a server admits: the longest sequence, how many at once, how many tokens one
    forward may take (chunked prefill; None: whole prompts), and a preallocated KV pool (None:
    the KV cache grows with the requests)."""

    max_model_len: int
    max_num_seqs: int
    max_batch_tokens: int | None = None
    kv_pool_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_model_len", "max_num_seqs", "max_batch_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise UsageError(f"admission: {name} must be a positive integer, got {value!r}")
        if self.kv_pool_bytes is not None and self.kv_pool_bytes < 0:
            raise UsageError(f"admission: kv_pool_bytes must be >= 0, got {self.kv_pool_bytes}")


@dataclass(frozen=True)
class AdmissionCheck:
    fits: bool
    prefill_tokens: int  # the worst admissible forward: the longest prompts, all at once
    kv_bytes: int  # the pool, or the KV of max_num_seqs sequences of max_model_len
    activation_bytes: int  # of that forward (the estimator's allowance)
    needed_bytes: int  # weights + overhead + KV + activations
    limit_bytes: int
    headroom_bytes: int  # limit − needed (negative: the worst request cannot fit)
    lower: str | None  # the limit to lower, when it does not fit
    lower_to: int | None
    message: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def admission_check(shape: ModelShape, admission: Admission, limit_bytes: int, *,
                    overhead_bytes: int = 1 * GiB, weight_dtype: str | None = None,
                    kv_dtype: str | None = None) -> AdmissionCheck:
    """Can the worst request the server admits fit? (The early warning for a prefill-spike
    OOM: nothing in a memory trend foresees one 16 × 16,000-token prompt, but the limits say
    in advance that it can be admitted.) Uses the estimator's formulas; when it cannot fit,
    names the limit to lower and the largest value that fits."""
    a = admission
    weights = int(shape.num_params * dtype_bytes(weight_dtype or shape.dtype))
    per_token_kv = shape.kv_bytes_per_token(kv_dtype)
    whole = a.max_num_seqs * a.max_model_len
    tokens = min(whole, a.max_batch_tokens) if a.max_batch_tokens else whole
    kv = a.kv_pool_bytes if a.kv_pool_bytes is not None else per_token_kv * whole
    plan = Plan(context_tokens=a.max_model_len, concurrency=a.max_num_seqs,
                gpu_memory_bytes=limit_bytes, overhead_bytes=overhead_bytes,
                prefill_tokens=tokens)
    acts = activation_bytes(shape, plan)
    needed = weights + overhead_bytes + kv + acts
    lower, lower_to = (None, None) if needed <= limit_bytes else _limit_to_lower(
        shape, a, limit_bytes - weights - overhead_bytes, per_token_kv)
    gib = float(GiB)
    if lower is None and needed <= limit_bytes:
        message = (f"the worst admissible request ({a.max_num_seqs} x {a.max_model_len} tokens, "
                   f"{tokens} in one forward) fits: {needed / gib:.2f} of {limit_bytes / gib:.2f}"
                   " GiB")
    else:
        fix = f"lower {lower} to {lower_to}" if lower else "the weights alone do not fit"
        message = (f"the worst admissible request ({a.max_num_seqs} x {a.max_model_len} tokens, "
                   f"{tokens} in one forward) cannot fit: it needs {needed / gib:.2f} GiB of "
                   f"{limit_bytes / gib:.2f} GiB; {fix}")
    return AdmissionCheck(needed <= limit_bytes, tokens, kv, acts, needed, limit_bytes,
                          limit_bytes - needed, lower, lower_to, message)


def _limit_to_lower(shape: ModelShape, a: Admission, room: int,
                    per_token_kv: int) -> tuple[str | None, int | None]:
    """The first limit whose lowering makes the worst request fit, and its largest value:
    the tokens of one forward (chunked prefill) when the server has that limit, else the
    number of sequences, else the sequence length."""
    inter = shape.intermediate_size or 4 * shape.hidden_size
    per_token_act = (4 * shape.hidden_size + 2 * inter) * dtype_bytes(shape.dtype)
    logits = a.max_num_seqs * shape.vocab_size * 4
    if a.kv_pool_bytes is not None:
        free = room - a.kv_pool_bytes - logits
        most = int(free // per_token_act) if free > 0 else 0
        if a.max_batch_tokens and most >= 1:
            return "max_batch_tokens", most
        if most >= a.max_model_len:
            return "max_num_seqs", most // a.max_model_len
        return ("max_batch_tokens", most) if most >= 1 else (None, None)
    # no pool: KV and activations both grow with the sequences admitted
    per_seq = a.max_model_len * (per_token_kv + per_token_act) + shape.vocab_size * 4
    if room >= per_seq:
        return "max_num_seqs", int(room // per_seq)
    per_len = a.max_num_seqs * (per_token_kv + per_token_act)  # one more token of each
    free = room - logits
    return ("max_model_len", int(free // per_len)) if free >= per_len else (None, None)
