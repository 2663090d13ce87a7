"""Run a real vLLM engine on the tiny model with known prompts; the vLLM tests and
``vramscope bench vllm`` start it as a subprocess.

    python tests/vllm/engine_run.py MODEL_DIR OUT_JSON [--truth STEPS_JSONL]

Prompts are token ids (lengths known exactly), outputs are forced to ``max_tokens`` with
``ignore_eos``. Two rounds: the second repeats the first round's longest prompt, so the prefix
cache has something to hit. ``--truth`` makes the engine-core process write vLLM's own view
after every ``schedule()`` (usage, free blocks, cached blocks counted by walking the pool) as
JSON lines, and after every ``update_from_output()`` (the step's end, ``"at": "update"``): the
ground truth the plugin's records are compared against. The patch that writes
it sits at module level because vLLM starts its engine core by spawn or fork; either way this
module's top level runs (or ran) in that process before the engine's plugins load, so the
plugin's wrapper ends up outside this one and both read the same state.
"""

from __future__ import annotations

import json
import os
import random
import sys

PROMPT_LENS = (5, 17, 33, 40, 9, 150)
OUTPUT_LENS = (4, 8, 3, 12, 6, 10)
TRUTH_ENV = "VRAMSCOPE_TEST_VLLM_TRUTH"


def _record_truth(path: str) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    original, original_update = Scheduler.schedule, Scheduler.update_from_output

    def write(self, at: str, scheduled: int) -> None:
        pool = self.kv_cache_manager.block_pool
        cached = sum(1 for b in pool.blocks
                     if b.ref_cnt == 0 and b.block_hash is not None and not b.is_null)
        row = {"pid": os.getpid(), "at": at, "usage": self.kv_cache_manager.usage,
               "free": pool.get_num_free_blocks(), "total": pool.num_gpu_blocks - 1,
               "cached": cached, "scheduled": scheduled, "block_size": self.block_size}
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")

    def schedule(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        write(self, "schedule", sum(out.num_scheduled_tokens.values()))
        return out

    def update_from_output(self, *args, **kwargs):
        out = original_update(self, *args, **kwargs)
        write(self, "update", 0)  # the step's end: what vLLM's stats read
        return out

    Scheduler.schedule = schedule
    Scheduler.update_from_output = update_from_output


if os.environ.get(TRUTH_ENV):
    _record_truth(os.environ[TRUTH_ENV])


def prompts(seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 128) for _ in range(n)] for n in PROMPT_LENS]


def main(model: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, max_model_len=256, enforce_eager=True, dtype="bfloat16", seed=0)
    first = prompts()
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)
              for n in OUTPUT_LENS]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in first], params)
    longest = max(range(len(first)), key=lambda i: len(first[i]))
    again = llm.generate([TokensPrompt(prompt_token_ids=first[longest])], [params[longest]])
    results = [{"prompt": len(o.prompt_token_ids), "output": len(o.outputs[0].token_ids),
                "cached": o.num_cached_tokens or 0} for o in outs + again]
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump({"requests": results, "pid": os.getpid()}, fh)
    print("engine_run: done", flush=True)
    # wait for the test to see the records before the engine goes away
    sys.stdin.readline()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
