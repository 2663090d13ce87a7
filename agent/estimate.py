"""The capacity planner behind ``vramscope estimate`` and the dashboard's Capacity page.

Given a model's shape (from a Hugging Face ``config.json`` or explicit numbers) and a serving
plan (context length, concurrency, KV dtype), it adds up what an inference server holds on one
GPU (weights, overhead, KV cache, activations; under tensor parallelism each GPU's share plus
:func:`comm_buffer_bytes`), compares it with the GPU's memory less a safety margin, solves for
the largest concurrency and context, and sizes a paged KV pool. The formulas and why:
docs/estimate.md, "What it adds up" and "Tensor parallelism: one GPU's share". The activation
term is an allowance for the prefill peak, not an exact figure. Pure functions, no I/O except
:func:`load_hf_config`.
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
    num_attention_heads: int = 0  # 0: not given, taken as hidden size / head dim
    num_experts: int = 1  # a mixture's experts (each one's MLP splits across GPUs, its router not)

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "num_kv_heads", "head_dim", "hidden_size", "num_params",
                           "num_experts"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value <= 0:
                raise UsageError(f"model shape: {field_name} must be a positive integer, "
                                 f"got {value!r}")
        dtype_bytes(self.dtype)

    @property
    def attention_heads(self) -> int:
        return self.num_attention_heads or max(1, self.hidden_size // self.head_dim)

    def kv_heads_per_gpu(self, tensor_parallel: int = 1) -> int:
        """The KV heads one GPU holds, as vLLM places them: the KV heads split across the GPUs,
        and when there are fewer KV heads than GPUs each GPU holds one, replicated (vLLM's
        ``max(1, total KV heads // tensor parallel size)``)."""
        return max(1, self.num_kv_heads // tensor_parallel)

    def kv_bytes_per_token(self, kv_dtype: str | None = None, tensor_parallel: int = 1) -> int:
        """2 (K and V) × layers × KV heads × head dim × bytes per element, on one GPU."""
        per = dtype_bytes(kv_dtype or self.dtype)
        heads = self.kv_heads_per_gpu(tensor_parallel)
        return int(2 * self.num_layers * heads * self.head_dim * per)


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
                      max_position_embeddings=cfg.get("max_position_embeddings"), name=name,
                      num_attention_heads=heads,
                      num_experts=int(cfg.get("num_local_experts") or 1))


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


def check_tensor_parallel(shape: ModelShape, tensor_parallel: int) -> None:
    """The tensor-parallel sizes vLLM accepts: the attention heads split evenly, and the KV
    heads either split evenly or (fewer KV heads than GPUs) replicate evenly."""
    flag = "--tensor-parallel"
    if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int) \
            or tensor_parallel <= 0:
        raise UsageError(f"{flag} must be a positive integer (GPUs), got {tensor_parallel!r}")
    heads, kv = shape.attention_heads, shape.num_kv_heads
    if heads % tensor_parallel:
        raise UsageError(f"{flag} {tensor_parallel} does not divide {shape.name}'s {heads} "
                         "attention heads (each GPU takes an equal share)")
    if kv >= tensor_parallel and kv % tensor_parallel:
        raise UsageError(f"{flag} {tensor_parallel} does not divide {shape.name}'s {kv} KV "
                         "heads (each GPU takes an equal share)")
    if kv < tensor_parallel and tensor_parallel % kv:
        raise UsageError(f"{flag} {tensor_parallel} is not a multiple of {shape.name}'s {kv} KV "
                         "heads (with fewer KV heads than GPUs each is replicated evenly)")


def parameters_per_gpu(shape: ModelShape, tensor_parallel: int = 1) -> int:
    """The parameters one GPU holds under tensor parallelism. vLLM splits the q, o and MLP
    matrices (every expert's, in a mixture), the embedding and the LM head N ways; it replicates
    the norms and a mixture's router; and each GPU holds the K and V projections of its own KV
    heads, so with fewer KV heads than GPUs those are replicated too. Counted from the total
    (given or counted from the shape), so a given ``num_parameters`` splits the same way."""
    layers, hidden = shape.num_layers, shape.hidden_size
    replicated = layers * 2 * hidden + hidden  # two norms a layer, the final norm
    if shape.num_experts > 1:
        replicated += layers * hidden * shape.num_experts  # the router
    kv_projections = layers * 2 * hidden * shape.head_dim * shape.num_kv_heads
    split = shape.num_params - replicated - kv_projections
    own_kv = layers * 2 * hidden * shape.head_dim * shape.kv_heads_per_gpu(tensor_parallel)
    return -(-split // tensor_parallel) + replicated + own_kv


# vLLM's custom all-reduce (TP 2, 4, 6 and 8 on one node), per GPU: an 8 MiB IPC buffer that
# inputs are copied into, 8 MiB of signals and scratch, 8 MiB of registered pointer tuples
# (vllm/distributed/device_communicators/custom_all_reduce.py).
CUSTOM_ALL_REDUCE_BYTES = 3 * 8 * MiB
CUSTOM_ALL_REDUCE_SIZES = (2, 4, 6, 8)  # other sizes all-reduce through NCCL alone
# NCCL's receive buffers for one ring connection of one channel, at the default sizes:
# Simple 4 MiB (NCCL_BUFFSIZE), LL128 4,915,200 B, LL 524,288 B.
NCCL_CHANNEL_BYTES = 4 * MiB + 4_915_200 + 524_288
# The channels NCCL opens on an NVLink node (H100, H200, A100 SXM); fewer over PCIe.
NCCL_CHANNELS = 32


def comm_buffer_bytes(tensor_parallel: int) -> int:
    """The communication buffers one GPU holds for tensor parallelism (none on one GPU): vLLM's
    custom all-reduce buffers and NCCL's ring buffers over its channels. CUDA graphs, cuBLAS
    workspaces and the CUDA context stay in ``overhead_bytes``. An allowance, not a
    measurement: ``Plan.comm_buffer_bytes`` overrides it."""
    if tensor_parallel <= 1:
        return 0
    custom = CUSTOM_ALL_REDUCE_BYTES if tensor_parallel in CUSTOM_ALL_REDUCE_SIZES else 0
    return custom + NCCL_CHANNELS * NCCL_CHANNEL_BYTES


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
    tensor_parallel: int = 1  # GPUs the model is split across; every figure is one GPU's
    comm_buffer_bytes: int | None = None  # None: comm_buffer_bytes(tensor_parallel)

    @property
    def comm_bytes(self) -> int:
        return (comm_buffer_bytes(self.tensor_parallel) if self.comm_buffer_bytes is None
                else self.comm_buffer_bytes)

    def __post_init__(self) -> None:
        if isinstance(self.tensor_parallel, bool) or not isinstance(self.tensor_parallel, int) \
                or self.tensor_parallel <= 0:
            raise UsageError("--tensor-parallel must be a positive integer (GPUs), got "
                             f"{self.tensor_parallel!r}")
        if self.comm_buffer_bytes is not None and self.comm_buffer_bytes < 0:
            raise UsageError(f"communication buffers must be >= 0, got {self.comm_buffer_bytes}")
        for name in ("context_tokens", "concurrency", "gpu_memory_bytes", "block_size_tokens"):
            if getattr(self, name) <= 0:
                raise UsageError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.margin_ratio < 1:
            raise UsageError(f"margin must be in [0, 1), got {self.margin_ratio}")
        if self.overhead_bytes < 0:
            raise UsageError(f"overhead must be >= 0, got {self.overhead_bytes}")


@dataclass(frozen=True)
class Estimate:
    """One GPU's figures (with tensor parallelism, each of ``tensor_parallel`` GPUs')."""

    model: str
    tensor_parallel: int
    kv_heads_per_gpu: int
    weights_bytes: int
    overhead_bytes: int
    comm_buffer_bytes: int
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


def weights_bytes(shape: ModelShape, weight_dtype: str | None = None,
                  tensor_parallel: int = 1) -> int:
    """One GPU's weights: its parameters × bytes per weight."""
    per = dtype_bytes(weight_dtype or shape.dtype)
    return int(parameters_per_gpu(shape, tensor_parallel) * per)


def estimate(shape: ModelShape, plan: Plan) -> Estimate:
    tp = plan.tensor_parallel
    check_tensor_parallel(shape, tp)
    weights = weights_bytes(shape, plan.weight_dtype, tp)
    fixed = plan.overhead_bytes + plan.comm_bytes  # what no request changes
    per_token = shape.kv_bytes_per_token(plan.kv_dtype, tp)
    kv = per_token * plan.context_tokens * plan.concurrency
    activations = activation_bytes(shape, plan)
    total = weights + fixed + kv + activations
    usable = int(plan.gpu_memory_bytes * (1 - plan.margin_ratio))
    kv_budget = max(0, usable - weights - fixed - activations)
    block_bytes = per_token * plan.block_size_tokens
    return Estimate(
        model=shape.name, tensor_parallel=tp, kv_heads_per_gpu=shape.kv_heads_per_gpu(tp),
        weights_bytes=weights, overhead_bytes=plan.overhead_bytes,
        comm_buffer_bytes=plan.comm_bytes,
        kv_bytes_per_token=per_token, kv_cache_bytes=kv, activation_bytes=activations,
        total_bytes=total, gpu_memory_bytes=plan.gpu_memory_bytes, usable_bytes=usable,
        fits=total <= usable, headroom_bytes=usable - total,
        max_concurrency=kv_budget // (per_token * plan.context_tokens),
        max_context_tokens=largest_context(shape, plan, usable - weights - fixed),
        block_size_tokens=plan.block_size_tokens, block_bytes=block_bytes,
        pool_blocks=kv_budget // block_bytes,
        blocks_needed=plan.concurrency * -(-plan.context_tokens // plan.block_size_tokens))


def largest_context(shape: ModelShape, plan: Plan, budget_bytes: int) -> int:
    """The longest context that fits ``budget_bytes`` (usable memory less weights, overhead and
    communication buffers) at the plan's concurrency. Without a prefill cap the prompt is
    prefilled whole, so the activation allowance grows with the context too: a longer context
    costs KV *and* a larger prefill peak (the plan's own context's allowance would overstate
    what is left)."""
    logits = plan.concurrency * shape.vocab_size * 4
    kv_per_token = shape.kv_bytes_per_token(plan.kv_dtype, plan.tensor_parallel) \
        * plan.concurrency
    if plan.prefill_tokens:  # chunked prefill: the peak does not grow with the context
        return max(0, budget_bytes - activation_bytes(shape, plan)) // kv_per_token
    per_token_act = _activation_bytes_per_token(shape, plan.tensor_parallel)
    return max(0, budget_bytes - logits) // (kv_per_token + per_token_act)


def _activation_bytes_per_token(shape: ModelShape, tensor_parallel: int = 1) -> int:
    """Hidden-state temporaries (whole on every GPU: each all-reduce restores them) and the
    MLP's (split across the GPUs, as its matrices are)."""
    inter = shape.intermediate_size or 4 * shape.hidden_size
    inter_per_gpu = -(-inter // tensor_parallel)
    return int((4 * shape.hidden_size + 2 * inter_per_gpu) * dtype_bytes(shape.dtype))


def activation_bytes(shape: ModelShape, plan: Plan) -> int:
    """An allowance for the prefill peak: one layer's hidden and MLP temporaries over the
    prefill tokens, plus one step's fp32 logits for every sequence (whole on the GPU that
    samples: vLLM gathers the vocabulary's shards there)."""
    tokens = plan.prefill_tokens or plan.context_tokens
    return (tokens * _activation_bytes_per_token(shape, plan.tensor_parallel)
            + plan.concurrency * shape.vocab_size * 4)


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
                    kv_dtype: str | None = None, tensor_parallel: int = 1) -> AdmissionCheck:
    """Can the worst request the server admits fit? (The early warning for a prefill-spike
    OOM: nothing in a memory trend foresees one 16 × 16,000-token prompt, but the limits say
    in advance that it can be admitted.) Uses the estimator's formulas; when it cannot fit,
    names the limit to lower and the largest value that fits."""
    a = admission
    check_tensor_parallel(shape, tensor_parallel)
    whole = a.max_num_seqs * a.max_model_len
    tokens = min(whole, a.max_batch_tokens) if a.max_batch_tokens else whole
    plan = Plan(context_tokens=a.max_model_len, concurrency=a.max_num_seqs,
                gpu_memory_bytes=limit_bytes, overhead_bytes=overhead_bytes,
                prefill_tokens=tokens, tensor_parallel=tensor_parallel)
    weights = weights_bytes(shape, weight_dtype, tensor_parallel)
    fixed = overhead_bytes + plan.comm_bytes
    per_token_kv = shape.kv_bytes_per_token(kv_dtype, tensor_parallel)
    kv = a.kv_pool_bytes if a.kv_pool_bytes is not None else per_token_kv * whole
    acts = activation_bytes(shape, plan)
    needed = weights + fixed + kv + acts
    lower, lower_to = (None, None) if needed <= limit_bytes else _limit_to_lower(
        shape, a, limit_bytes - weights - fixed, per_token_kv, tensor_parallel)
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


def _limit_to_lower(shape: ModelShape, a: Admission, room: int, per_token_kv: int,
                    tensor_parallel: int) -> tuple[str | None, int | None]:
    """The first limit whose lowering makes the worst request fit, and its largest value:
    the tokens of one forward (chunked prefill) when the server has that limit, else the
    number of sequences, else the sequence length."""
    per_token_act = _activation_bytes_per_token(shape, tensor_parallel)
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
