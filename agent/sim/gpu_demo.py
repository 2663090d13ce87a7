"""``vramscope demo --gpu``: the real hooks on a small random-weight transformers model on CUDA.

Instead of simulated servers, this process loads a Llama-shaped model built from a config with
random weights (no download), installs vramscope's hooks with the embedded agent as their sink
(allocator counters, snapshots, the OOM observer, phases through ``attach_transformers``), and
calls ``generate`` on random prompts of random lengths and batch sizes until the duration ends.
The agent samples the GPU through NVML as it would next to any server.
"""

from __future__ import annotations

import argparse
import random
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any

from vramscope.agent.errors import VramscopeError

if TYPE_CHECKING:
    from vramscope.agent.config import Config

MODEL_SHAPE: dict[str, Any] = {
    "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
    "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
    "max_position_embeddings": 4096}


def require_cuda() -> ModuleType:
    try:
        import torch
    except ImportError:
        raise VramscopeError("--gpu needs torch with CUDA, and torch is not installed; run "
                             "`vramscope demo` without --gpu for the simulated servers") from None
    if not torch.cuda.is_available():
        raise VramscopeError(f"--gpu needs a CUDA GPU, but torch.cuda.is_available() is False "
                             f"(torch {torch.__version__}); run `vramscope demo` without --gpu "
                             "for the simulated servers")
    return torch


def build_model(torch: ModuleType) -> Any:  # a transformers model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(LlamaConfig(**MODEL_SHAPE))  # its stubs lack .to(dtype)
    return model.to(device="cuda", dtype=torch.bfloat16).eval()


def run_gpu_demo(config: Config, db_url: str, args: argparse.Namespace) -> int:
    torch = require_cuda()
    from vramscope.agent.embedded import EmbeddedAgent
    from vramscope.agent.sim.demo import dashboard_while_running

    import vramscope

    agent = EmbeddedAgent(config, db_url=db_url).start()
    handle = None
    with dashboard_while_running(config, agent, args) as url:
        try:
            print(f"vramscope demo --gpu: dashboard at {url}; database {db_url}")
            report = vramscope.install(config, sink=agent.sink)
            print(report)
            model = build_model(torch)
            handle = vramscope.attach_transformers(model, sink=agent.sink)
            if not args.no_browser:
                import webbrowser

                webbrowser.open(url)
            served = generate_until(torch, model, args.duration)
            print(f"demo finished: {served} generate calls; database {db_url}")
        finally:
            if handle is not None:
                handle.detach()
            vramscope.uninstall()
    return 0


def generate_until(torch: ModuleType, model: Any, duration_s: float | None) -> int:
    rng = random.Random(0)
    t0, calls = time.monotonic(), 0
    while duration_s is None or time.monotonic() - t0 < duration_s:
        batch, prompt = rng.randint(1, 8), rng.randint(32, 1024)
        ids = torch.randint(0, MODEL_SHAPE["vocab_size"], (batch, prompt), device="cuda")
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids),
                           max_new_tokens=rng.randint(16, 128), do_sample=False, pad_token_id=0)
        calls += 1
        print(f"\r{calls} generate calls, last batch {batch} x {prompt} tokens, "
              f"{torch.cuda.memory_allocated() / 2**30:.2f} GiB allocated", end="", flush=True)
    print()
    return calls
