"""``vramscope estimate [CONFIG.json] [shape flags] [plan flags] [--json]``: capacity planning.

Exits 0 when the plan fits, 1 when it does not (the report is printed either way)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from vramscope.agent.errors import UsageError
from vramscope.agent.estimate import PRESETS

if TYPE_CHECKING:
    from types import ModuleType

    from vramscope.agent.estimate import Estimate, ModelShape, Plan


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "estimate", help="plan GPU memory: weights, KV cache, what concurrency/context fits",
        description="Estimate GPU memory for serving a model, from a Hugging Face config.json "
                    "or explicit numbers (flags override the file).")
    p.add_argument("config", nargs="?", help="a Hugging Face config.json")
    p.add_argument("--model", metavar="NAME",
                   help="a known model's published shape instead of a config.json: "
                        + ", ".join(PRESETS) + " (or its Hugging Face id)")
    shape = p.add_argument_group("model shape (override or replace the config file or "
                                 "--model)")
    shape.add_argument("--layers", type=int)
    shape.add_argument("--kv-heads", type=int)
    shape.add_argument("--head-dim", type=int)
    shape.add_argument("--hidden", type=int, help="hidden size")
    shape.add_argument("--intermediate", type=int, help="MLP intermediate size")
    shape.add_argument("--vocab", type=int, help="vocabulary size")
    shape.add_argument("--params", type=_count, help="parameter count: 7e9, 7B, 500M")
    shape.add_argument("--mlp", choices=("gated", "plain"),
                       help="MLP kind for counting parameters: gated (gate, up, down: Llama, "
                            "Qwen, Mistral) or plain (GPT-2); default: the config's model_type, "
                            "else gated")
    shape.add_argument("--dtype", help="model dtype (default: the config's, else bfloat16)")
    plan = p.add_argument_group("serving plan")
    plan.add_argument("--context", type=int, default=4096, help="tokens per sequence")
    plan.add_argument("--concurrency", type=int, default=1, help="sequences at once")
    plan.add_argument("--kv-dtype", help="KV cache dtype, e.g. fp8 (default: model dtype)")
    plan.add_argument("--weight-dtype", help="weight dtype, e.g. int4 (default: model dtype)")
    plan.add_argument("--gpu", default="H100", help="GPU name (H200, H100, A100-80GB, L4...)")
    plan.add_argument("--gpu-memory-gib", type=float, help="GPU memory, overrides --gpu")
    plan.add_argument("--overhead-gib", type=float, default=1.0,
                      help="CUDA context, workspaces and slack (default 1 GiB)")
    plan.add_argument("--margin", type=float, default=0.10,
                      help="safety margin as a share of GPU memory (default 0.10)")
    plan.add_argument("--block-size", type=int, default=16, help="paged KV block, in tokens")
    plan.add_argument("--prefill-tokens", type=int,
                      help="largest prefill chunk (default: one whole context)")
    plan.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                      help="GPUs the model is split across (vLLM's --tensor-parallel-size); "
                           "every figure is then one GPU's (default 1)")
    plan.add_argument("--comm-buffer-mib", type=float,
                      help="communication buffers per GPU under tensor parallelism (default: "
                           "vLLM's custom all-reduce and NCCL's ring buffers, 318 MiB)")
    admit = p.add_argument_group(
        "admission limits (check that the worst request the server admits can fit: the "
        "longest prompt, --context tokens, times --max-num-seqs in one forward)")
    admit.add_argument("--max-num-seqs", type=int, help="sequences admitted at once")
    admit.add_argument("--max-batch-tokens", type=int,
                       help="tokens one forward may take (chunked prefill; default: no limit)")
    admit.add_argument("--kv-pool-gib", type=float,
                       help="a preallocated KV pool (default: the KV cache grows per request)")
    p.add_argument("--json", action="store_true", help="print the estimate as JSON")
    p.set_defaults(func=run)


def _count(text: str) -> int:
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}.get(text[-1:].upper())
    try:
        return int(float(text[:-1]) * scale) if scale else int(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a parameter count: {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from vramscope.agent import estimate as est

    shape = _shape(args, est)
    gpu_bytes = (int(args.gpu_memory_gib * est.GiB) if args.gpu_memory_gib
                 else est.gpu_memory_bytes(args.gpu))
    plan = est.Plan(context_tokens=args.context, concurrency=args.concurrency,
                    gpu_memory_bytes=gpu_bytes, kv_dtype=args.kv_dtype,
                    weight_dtype=args.weight_dtype, overhead_bytes=int(args.overhead_gib * est.GiB),
                    margin_ratio=args.margin, block_size_tokens=args.block_size,
                    prefill_tokens=args.prefill_tokens, tensor_parallel=args.tensor_parallel,
                    comm_buffer_bytes=(None if args.comm_buffer_mib is None
                                       else int(args.comm_buffer_mib * est.MiB)))
    result = est.estimate(shape, plan)
    check = None
    if args.max_num_seqs is not None:
        pool = None if args.kv_pool_gib is None else int(args.kv_pool_gib * est.GiB)
        admission = est.Admission(max_model_len=args.context, max_num_seqs=args.max_num_seqs,
                                  max_batch_tokens=args.max_batch_tokens, kv_pool_bytes=pool)
        check = est.admission_check(shape, admission, gpu_bytes,
                                    overhead_bytes=plan.overhead_bytes,
                                    weight_dtype=args.weight_dtype, kv_dtype=args.kv_dtype,
                                    tensor_parallel=args.tensor_parallel)
    if args.json:
        doc = {"format": "vramscope.estimate/1", **result.to_json()}
        if check is not None:
            doc["admission"] = check.to_json()
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print(render(result, plan, shape))
        if check is not None:
            print(("" if check.fits else "WARNING: ") + check.message)
    # scriptable: "does not fit" (or a worst admissible request that cannot) is a failure
    return 0 if result.fits and (check is None or check.fits) else 1


# The shape flags without which a model has no shape, with the config.json keys they give
# (the first of each tuple is the one the flag sets).
_REQUIRED = (("--layers", ("num_hidden_layers", "n_layer", "num_layers")),
             ("--hidden", ("hidden_size", "n_embd", "d_model")),
             ("--head-dim", ("num_attention_heads", "n_head", "head_dim")))


def _shape(args: argparse.Namespace, est: ModuleType) -> ModelShape:
    if args.config and args.model:
        raise UsageError("give a config.json or --model, not both")
    name = args.config or "model"
    if args.model:
        name, cfg = est.preset(args.model)
    else:
        cfg = est.load_hf_config(args.config) if args.config else {}
    cfg = dict(cfg.get("text_config") or cfg)
    flags = {"num_hidden_layers": args.layers, "num_key_value_heads": args.kv_heads,
             "head_dim": args.head_dim, "hidden_size": args.hidden,
             "intermediate_size": args.intermediate, "vocab_size": args.vocab,
             "num_parameters": args.params, "torch_dtype": args.dtype}
    cfg.update({k: v for k, v in flags.items() if v is not None})
    from_file = bool(args.config or args.model)
    if args.mlp or not from_file:  # flags alone: a gated MLP, as today's decoder LLMs
        cfg["model_type"] = "llama" if (args.mlp or "gated") == "gated" else "gpt2"
    if "num_attention_heads" not in cfg and "head_dim" in cfg and "hidden_size" in cfg:
        cfg["num_attention_heads"] = cfg["hidden_size"] // cfg["head_dim"]
    _require_shape(cfg, args.config)
    if not cfg.get("num_parameters") and not cfg.get("vocab_size") and not from_file:
        raise UsageError("give --params (or --vocab and --intermediate so they can be counted)")
    shape: ModelShape = est.shape_from_hf_config(cfg, name=name)
    return shape


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _require_shape(cfg: dict[str, object], config_file: str | None) -> None:
    """Name every shape flag still missing, at once (the old message named a config key
    though no config file was given)."""
    missing = [flag for flag, keys in _REQUIRED if not any(_positive(cfg.get(k)) for k in keys)]
    if not missing:
        return
    keys = [keys[0] for flag, keys in _REQUIRED if flag in missing]
    where = (f"{config_file} has no {', '.join(keys)}" if config_file else
             "no model shape" if len(missing) == len(_REQUIRED) else "incomplete model shape")
    raise UsageError(f"{where}: give {' and '.join(missing)}, or --model NAME for a known "
                     f"model ({', '.join(PRESETS)})")


def render(r: Estimate, plan: Plan, shape: ModelShape) -> str:
    gib = 1 << 30

    def g(n: int) -> str:
        return f"{n / gib:9.2f} GiB"

    tp = r.tensor_parallel
    lines = [
        f"{r.model}: {shape.num_params / 1e9:.2f} B parameters, {shape.num_layers} layers, "
        f"{shape.num_kv_heads} KV heads × {shape.head_dim}",
        *([f"tensor parallel   {tp} GPUs: the figures below are one GPU's "
           f"({r.kv_heads_per_gpu} KV head{'s' if r.kv_heads_per_gpu > 1 else ''} each"
           + (", replicated)" if shape.num_kv_heads < tp else ")")] if tp > 1 else []),
        f"KV per token      {r.kv_bytes_per_token / 1024:9.1f} KiB",
        f"weights           {g(r.weights_bytes)}",
        f"runtime overhead  {g(r.overhead_bytes)}",
        *([f"comm buffers      {g(r.comm_buffer_bytes)}   (all-reduce and NCCL)"]
          if tp > 1 or r.comm_buffer_bytes else []),
        f"KV cache          {g(r.kv_cache_bytes)}   ({plan.concurrency} × {plan.context_tokens}"
        " tokens)",
        f"activations       {g(r.activation_bytes)}   (prefill allowance)",
        f"total             {g(r.total_bytes)}",
        f"GPU               {g(r.gpu_memory_bytes)}   usable {g(r.usable_bytes).strip()} after "
        f"a {plan.margin_ratio:.0%} margin",
        ("fits" if r.fits else "DOES NOT FIT") + f": headroom {r.headroom_bytes / gib:.2f} GiB",
        f"largest concurrency at {plan.context_tokens} tokens: {r.max_concurrency}",
        f"largest context at concurrency {plan.concurrency}: {r.max_context_tokens} tokens"
        + (f" (model maximum {shape.max_position_embeddings})"
           if shape.max_position_embeddings else ""),
        f"paged pool: {r.pool_blocks} blocks of {r.block_size_tokens} tokens "
        f"({r.block_bytes / 1024:.0f} KiB each); this plan needs {r.blocks_needed}",
    ]
    return "\n".join(lines)
