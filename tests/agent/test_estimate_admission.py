"""The OOM a configuration makes possible: the worst admissible request against the limit."""

import pytest
from vramscope.agent.errors import UsageError
from vramscope.agent.estimate import Admission, ModelShape, admission_check

# KV 2 x 2 layers x 1 head x 4 x 2 B = 32 B/token; activations (4 x 8 + 2 x 16) x 2 = 128 B/token
SHAPE = ModelShape(num_layers=2, num_kv_heads=1, head_dim=4, hidden_size=8, num_params=1000,
                   dtype="float16", intermediate_size=16, vocab_size=10)


def check(limit, **kw):
    kw.setdefault("max_model_len", 100)
    kw.setdefault("max_num_seqs", 4)
    return admission_check(SHAPE, Admission(**kw), limit, overhead_bytes=0)


def test_the_worst_request_fits():
    # weights 2000 + pool 10,000 + 400 tokens x 128 + 4 x 10 x 4 logits = 63,360
    c = check(70_000, kv_pool_bytes=10_000)
    assert (c.fits, c.prefill_tokens, c.activation_bytes, c.needed_bytes, c.headroom_bytes,
            c.lower) == (True, 400, 51_360, 63_360, 6_640, None)


def test_with_a_pool_and_no_chunking_lower_the_sequences():
    # 40,000 - 2000 - 10,000 - 160 leaves 27,840: 217 tokens in one forward, 2 whole prompts
    c = check(40_000, kv_pool_bytes=10_000)
    assert (c.fits, c.headroom_bytes, c.lower, c.lower_to) == (False, -23_360, "max_num_seqs", 2)
    assert "cannot fit" in c.message and "lower max_num_seqs to 2" in c.message
    assert check(40_000, kv_pool_bytes=10_000, max_num_seqs=2).fits


def test_with_chunked_prefill_lower_the_batch_tokens():
    c = check(40_000, kv_pool_bytes=10_000, max_batch_tokens=400)
    assert (c.lower, c.lower_to) == ("max_batch_tokens", 217)
    assert check(40_000, kv_pool_bytes=10_000, max_batch_tokens=217).fits
    assert not check(40_000, kv_pool_bytes=10_000, max_batch_tokens=218).fits


def test_without_a_pool_the_kv_grows_with_the_sequences():
    c = check(40_000)  # KV 400 x 32 = 12,800: 66,160 needed; 16,040 per sequence
    assert (c.kv_bytes, c.needed_bytes, c.lower, c.lower_to) == (12_800, 66_160,
                                                                "max_num_seqs", 2)
    assert check(40_000, max_num_seqs=2).fits
    c = check(3_000)  # not even one sequence: shorter sequences, 4 of them
    assert (c.lower, c.lower_to) == ("max_model_len", 1)
    assert check(3_000, max_model_len=1).fits and not check(3_000, max_model_len=2).fits


def test_bad_limits_are_named():
    with pytest.raises(UsageError, match="max_num_seqs must be a positive integer, got 0"):
        Admission(max_model_len=10, max_num_seqs=0)


def test_cli_warns_when_the_worst_admissible_prefill_cannot_fit(capsys):
    """A Llama-3-8B shape on an H200 with a 110 GiB KV pool admitting 16 prompts of 16,000
    tokens at once: one such batch's prefill needs 147 GiB (the prefill-spike OOM, foreseeable
    from the limits alone); with chunked prefill of 8,192 tokens it fits."""
    import json

    from vramscope.agent.cli import main

    argv = ["estimate", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--hidden",
            "4096", "--intermediate", "14336", "--vocab", "128256", "--params", "8B", "--gpu",
            "H200", "--context", "16000", "--max-num-seqs", "16", "--kv-pool-gib", "110"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == (
        "WARNING: the worst admissible request (16 x 16000 tokens, 256000 in one forward) "
        "cannot fit: it needs 147.39 GiB of 140.40 GiB; lower max_num_seqs to 10")
    assert main([*argv, "--max-batch-tokens", "8192", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["admission"]["fits"], doc["admission"]["prefill_tokens"]) == (True, 8192)
