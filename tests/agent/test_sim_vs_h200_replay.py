"""The caching-allocator model replays a recorded H200 run and matches it at every step.

``tests/data/gpu_allocator_check.jsonl`` is ``python -m tools.sim.gpu_check --out`` on
the H200
(torch 2.11, 1 GiB per-process cap): 3000 seeded allocations and frees, with the counters of
``torch.cuda.memory_stats()`` after each (``cuda``) and those of the model of the time
(``model``, which diverged at step 1879). The model of today must reproduce every ``cuda`` row.
"""

from __future__ import annotations

import json
from pathlib import Path

from tools.sim.gpu_check import FIELDS, first_divergence, op_sequence, run_model

RECORD = Path(__file__).resolve().parents[1] / "data" / "gpu_allocator_check.jsonl"
LIMIT_BYTES = 1 << 30  # gpu_check's default --limit-mib 1024, as recorded


def recorded() -> list[dict]:
    with RECORD.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_the_record_is_gpu_checks_seeded_sequence_with_ooms_and_retries():
    rows = recorded()
    assert [r["step"] for r in rows] == list(range(3000))
    assert [tuple(r["op"]) for r in rows] == op_sequence(0, 3000)
    last = rows[-1]["cuda"]
    # the cap is reached: the replay exercises retries and OOMs, not just best fit
    assert max(r["cuda"]["reserved"] for r in rows) == LIMIT_BYTES
    assert last["num_ooms"] > 44 and last["num_alloc_retries"] >= last["num_ooms"]


def test_model_matches_every_recorded_h200_counter_for_all_3000_steps():
    rows = recorded()
    real = [{f: r["cuda"][f] for f in FIELDS} for r in rows]
    model = run_model([tuple(r["op"]) for r in rows], LIMIT_BYTES)
    diverged = first_divergence(model, real)
    if diverged is not None:
        step, m, r = diverged
        raise AssertionError(f"first divergence at step {step} ({rows[step]['op']}): "
                             f"model {m} vs H200 {r}")
    assert model == real

