"""The caching-allocator model against PyTorch's allocator on a real CUDA device (``gpu``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.sim.gpu_check import first_divergence, op_sequence, run_model

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def test_op_sequence_is_seeded_and_the_model_runs_it():
    ops = op_sequence(0, 500)
    assert ops == op_sequence(0, 500) and ops != op_sequence(1, 500)
    series = run_model(ops, 256 * MiB)
    assert len(series) == 500
    assert series[-1]["num_ooms"] > 0  # 256 MiB is tight: the sequence exercises OOMs
    assert series[-1]["num_alloc_retries"] >= series[-1]["num_ooms"]
    assert first_divergence(series, series) is None


@pytest.mark.gpu
def test_model_matches_the_cuda_caching_allocator_step_by_step():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    # a fresh process: nothing else may hold memory on the device
    proc = subprocess.run([sys.executable, "-m", "tools.sim.gpu_check", "--steps", "3000",
                           "--limit-mib", "1024"], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
