"""On the GPU machine: the KV pool backed by a CUDA tensor, and transformers' pool observed.

Needs only torch, transformers, pytest and the repo (no flask / sqlalchemy on this path). Run:

    VRAMSCOPE_TRACE_OUT=$OUT/kv_generate_batch_trace.jsonl \\
        python -m pytest -m gpu -s -p no:cacheprovider tests/gpu/test_kvpool_gpu.py

``-s`` shows the ``KV_GPU_SUMMARY`` lines (figures for docs/gpu-verification.md); with
``VRAMSCOPE_TRACE_OUT`` set, the generate_batch test writes its KV trace (format v1) there, to
be committed as ``tests/data/kv_generate_batch_trace.jsonl``. Both tests were dry-run on CPU
(device and pinning lines swapped) with transformers 5.17.0 and 5.24.0 before the GPU run.
"""

from __future__ import annotations

import inspect
import json
import os
import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from vramscope.hooks.kvpool import KVBlockPool  # noqa: E402
from vramscope.hooks.sink import ListSink  # noqa: E402

SHAPE = dict(num_layers=2, num_kv_heads=2, head_dim=64, dtype="bfloat16", block_size=16)


def summary(name: str, **figures) -> None:
    print(f"KV_GPU_SUMMARY {json.dumps({'test': name, **figures}, sort_keys=True)}")


def same_bytes(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def attention(q, k, v):
    """One decode step's attention: q (heads, 1, d) over k, v (tokens, kv_heads, d), GQA x2."""
    k = k.transpose(0, 1).repeat_interleave(2, dim=0)
    v = v.transpose(0, 1).repeat_interleave(2, dim=0)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_cuda_pool_written_and_read_by_an_attention_step_byte_exact():
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    pool = KVBlockPool(**SHAPE, num_blocks=64, device="cuda", cpu_tier_bytes=8 * 65536)
    assert pool.bytes_per_block == 2 * 2 * 2 * 64 * 16 * 2 == 16384
    assert pool.buffer.tensor.is_cuda and pool.tier.pinned and pool.tier.host.is_pinned()
    assert torch.cuda.memory_allocated() - before == pool.size_bytes == 64 * 16384
    gen = torch.Generator(device="cuda").manual_seed(0)
    prompt = list(range(40))
    pool.allocate("a", token_ids=prompt)
    kv = {}
    for layer in range(2):
        k, v = (torch.randn(40, 2, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        pool.write_kv("a", layer, 0, k, v)
        kv[layer] = (k, v)
    q = torch.randn(4, 1, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    for layer, (k, v) in kv.items():
        got_k, got_v = pool.read_kv("a", layer)
        assert same_bytes(got_k, k) and same_bytes(got_v, v)
        assert same_bytes(attention(q, got_k, got_v), attention(q, k, v))
    # bookkeeping allocates nothing on the device
    steady = torch.cuda.memory_allocated()
    for i in range(100):
        pool.allocate(f"x{i}", 17)
        pool.free(f"x{i}")
    assert torch.cuda.memory_allocated() == steady
    # offload to pinned host memory and restore into other blocks: byte-exact
    pool.free("a")
    pool.allocate("filler", 64 * 16)  # takes every free block, then evicts a's two cached ones
    assert pool.stats().offloads == 2
    pool.free("filler")
    hit = pool.allocate("b", token_ids=prompt)
    assert (hit.hit_tokens, hit.restored_tokens) == (32, 32)
    for layer, (k, v) in kv.items():
        got_k, got_v = pool.read_kv("b", layer)
        assert same_bytes(got_k[:32], k[:32]) and same_bytes(got_v[:32], v[:32])
    summary("cuda_pool", size_bytes=pool.size_bytes, bytes_per_block=pool.bytes_per_block,
            offloads=pool.stats().offloads, restores=pool.stats().restores,
            device=torch.cuda.get_device_name(0))


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=1024)
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    # SDPA, stated: continuous batching would otherwise look for flash attention, which may mean
    # fetching kernels from the hub, and the GPU machine has no network. 5.17 keeps SDPA when
    # it is already paged; later releases drop the prefix and take auto_switch_to_flash=False.
    model.set_attn_implementation("sdpa" if _new_cb_config() else "paged|sdpa")
    return model


def _new_cb_config() -> bool:
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    return "auto_switch_to_flash" in inspect.signature(ContinuousBatchingConfig).parameters


def _configs(num_blocks: int = 256):
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    params = inspect.signature(ContinuousBatchingConfig).parameters
    page = "page_size" if "page_size" in params else "block_size"
    extra = {"auto_switch_to_flash": False} if _new_cb_config() else {}
    cb = ContinuousBatchingConfig(num_blocks=num_blocks, max_batch_tokens=512, **{page: 16},
                                  **extra)
    gen = GenerationConfig(max_new_tokens=32, do_sample=False, eos_token_id=-1, pad_token_id=0)
    return gen, cb


def test_generate_batch_with_the_adapter_writes_a_kv_trace():
    pytest.importorskip("transformers")
    import transformers
    from vramscope.agent.trace import parse_lines, write_trace
    from vramscope.hooks.transformers_kv import install_paged_cache_hook

    sink = ListSink()
    undo = install_paged_cache_hook(sink, sample_interval_s=0.0)
    try:
        model = _tiny_llama()
        system = [(7 * t) % 1000 + 1 for t in range(96)]  # 6 full blocks, shared
        gen, cb = _configs()
        t0 = time.perf_counter()
        with model.continuous_batching_context_manager(generation_config=gen,
                                                       continuous_batching_config=cb,
                                                       block=True, timeout=30) as manager:
            for i in range(4):  # one after another: each later request hits the prefix cache
                rid = manager.add_request(system + [900 + i] * 5, request_id=f"seq{i}",
                                          max_new_tokens=32)
                assert len(manager.get_result(request_id=rid, timeout=120).generated_tokens) == 32
            num_blocks = manager.batch_processor.cache.num_blocks
        prompts = [system + [800 + i] * (3 + i) for i in range(8)]
        out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb)
        wall_s = time.perf_counter() - t0
    finally:
        undo()
    assert len(out) == 8 and all(len(o.generated_tokens) == 32 for o in out.values())
    events = [e for e in sink.events() if e.name.startswith("kv_")]
    allocs = [e for e in events if e.name == "kv_alloc"]
    assert len(allocs) == 12 and len([e for e in events if e.name == "kv_free"]) == 12
    assert [e.data["hit_tokens"] for e in allocs[:4]] == [0, 96, 96, 96]
    assert not [e for e in events if e.name == "kv_orphaned_blocks"]
    samples = sink.samples()
    assert samples[-1].kv_blocks_used == 0 and samples[0].kv_blocks_total == num_blocks
    trace_path = os.environ.get("VRAMSCOPE_TRACE_OUT")
    if trace_path:
        with open(trace_path, "w", encoding="utf-8") as fh:
            lines = write_trace(fh, samples, sink.events())
        with open(trace_path, encoding="utf-8") as fh:
            assert len(parse_lines(fh, trace_path).samples) == len(samples)
    summary("generate_batch", transformers=transformers.__version__, wall_s=round(wall_s, 3),
            kv_blocks_total=num_blocks, peak_blocks_used=max(s.kv_blocks_used for s in samples),
            samples=len(samples), kv_events=len(events),
            hit_tokens=[e.data["hit_tokens"] for e in allocs],
            trace=trace_path, trace_lines=lines if trace_path else None)
