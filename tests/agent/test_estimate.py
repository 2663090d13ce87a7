"""The capacity planner against hand calculations on two public model configs."""

from __future__ import annotations

import json

import pytest
from vramscope.agent.cli import main
from vramscope.agent.errors import UsageError
from vramscope.agent.estimate import (
    GiB,
    MiB,
    Plan,
    estimate,
    gpu_memory_bytes,
    shape_from_hf_config,
)

# The shape keys of meta-llama/Llama-2-7b-hf and meta-llama/Meta-Llama-3-8B config.json.
LLAMA2_7B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
             "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
             "vocab_size": 32000, "torch_dtype": "float16", "tie_word_embeddings": False,
             "max_position_embeddings": 4096}
LLAMA3_8B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
             "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
             "vocab_size": 128256, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
             "max_position_embeddings": 8192}


def test_llama2_7b_shape_by_hand():
    s = shape_from_hf_config(LLAMA2_7B)
    # per layer: q,k,v,o 4 x 4096^2 = 67,108,864; MLP 3 x 4096 x 11008 = 135,266,304;
    # norms 8,192 -> 202,383,360 x 32 = 6,476,267,520; embeddings + head 2 x 32000 x 4096 =
    # 262,144,000; final norm 4,096. The published count is 6,738,415,616.
    assert s.num_params == 6_738_415_616
    assert s.head_dim == 128
    assert s.kv_bytes_per_token() == 512 * 1024  # 2 x 32 x 32 x 128 x 2 bytes


def test_llama3_8b_gqa_shape_by_hand():
    s = shape_from_hf_config(LLAMA3_8B)
    # attention 4096 x 128 x (2x32 + 2x8) = 41,943,040; MLP 3 x 4096 x 14336 = 176,160,768;
    # norms 8,192 -> 218,112,000 x 32 = 6,979,584,000; 2 x 128256 x 4096 = 1,050,673,152;
    # + 4,096. The published count is 8,030,261,248.
    assert s.num_params == 8_030_261_248
    assert s.kv_bytes_per_token() == 128 * 1024  # 8 KV heads: a quarter of Llama-2's
    assert s.kv_bytes_per_token("fp8") == 64 * 1024


def test_llama2_7b_on_an_h100_by_hand():
    plan = Plan(context_tokens=4096, concurrency=8, gpu_memory_bytes=gpu_memory_bytes("H100"))
    r = estimate(shape_from_hf_config(LLAMA2_7B), plan)
    assert r.weights_bytes == 2 * 6_738_415_616
    assert r.kv_cache_bytes == 16 * GiB  # 512 KiB x 4096 x 8
    # 4096 x (4x4096 + 2x11008) x 2 bytes + 8 x 32000 x 4 bytes of logits
    assert r.activation_bytes == 314_572_800 + 1_024_000
    assert r.total_bytes == 13_476_831_232 + GiB + 16 * GiB + 315_596_800
    assert r.gpu_memory_bytes == 81559 * MiB
    assert r.usable_bytes == int(81559 * MiB * 0.9)  # 76,968,728,985
    assert r.fits and r.headroom_bytes == 76_968_728_985 - 32_046_039_040
    # KV budget 76,968,728,985 - 13,476,831,232 - 1 GiB - 315,596,800 = 62,102,559,129
    assert r.max_concurrency == 28  # 62,102,559,129 // (512 KiB x 4096)
    # the longest context also prefills longer: (76,968,728,985 - 13,476,831,232 - 1 GiB - 8 x
    # 32000 x 4 of logits) // (512 KiB x 8 of KV + (4x4096 + 2x11008) x 2 of activations)
    assert r.max_context_tokens == 14613  # 62,417,131,929 // 4,271,104
    assert (r.block_bytes, r.pool_blocks, r.blocks_needed) == (8 * MiB, 7403, 8 * 256)


def test_llama3_8b_that_does_not_fit_on_an_l4():
    plan = Plan(context_tokens=8192, concurrency=16, gpu_memory_bytes=gpu_memory_bytes("L4"))
    r = estimate(shape_from_hf_config(LLAMA3_8B), plan)
    assert r.kv_cache_bytes == 16 * GiB  # 128 KiB x 8192 x 16
    assert not r.fits and r.headroom_bytes < 0
    # usable int(23034 MiB x 0.9) = 21,737,609,625; activations 8192 x (4x4096 + 2x14336) x 2
    # + 16 x 128256 x 4 = 746,405,888; KV budget 21,737,609,625 - 16,060,522,496 - 1 GiB -
    # 746,405,888 = 3,856,939,417: three 1 GiB contexts. The longest context for each of 16:
    # (21,737,609,625 - 16,060,522,496 - 1 GiB - 8,208,384 of logits) // (128 KiB x 16 +
    # 90,112 of activations per prefilled token) = 4,595,136,921 // 2,187,264 = 2100 (the 8k
    # plan's prefill allowance left only 1839)
    assert (r.max_concurrency, r.max_context_tokens) == (3, 2100)
    at_most = Plan(context_tokens=2100, concurrency=16, gpu_memory_bytes=gpu_memory_bytes("L4"))
    assert estimate(shape_from_hf_config(LLAMA3_8B), at_most).fits
    one_more = Plan(context_tokens=2101, concurrency=16, gpu_memory_bytes=gpu_memory_bytes("L4"))
    assert not estimate(shape_from_hf_config(LLAMA3_8B), one_more).fits
    plan_fp8 = Plan(context_tokens=8192, concurrency=16, gpu_memory_bytes=24 * GiB,
                    weight_dtype="int4", kv_dtype="fp8", margin_ratio=0.2)
    r = estimate(shape_from_hf_config(LLAMA3_8B), plan_fp8)
    assert r.weights_bytes == 8_030_261_248 // 2
    assert r.kv_cache_bytes == 8 * GiB


def test_bad_inputs_name_what_is_wrong():
    with pytest.raises(UsageError, match="num_hidden_layers"):
        shape_from_hf_config({"hidden_size": 8, "num_attention_heads": 2})
    with pytest.raises(UsageError, match="unknown dtype 'float13'"):
        shape_from_hf_config({**LLAMA2_7B, "torch_dtype": "float13"})
    with pytest.raises(UsageError, match="margin"):
        Plan(context_tokens=1, concurrency=1, gpu_memory_bytes=1, margin_ratio=1.5)
    with pytest.raises(UsageError, match="unknown GPU 'B9000'"):
        gpu_memory_bytes("B9000")


def test_cli_reads_a_config_file_and_prints_json(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    rc = main(["estimate", str(path), "--context", "8192", "--concurrency", "32", "--gpu",
               "H200", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["format"] == "vramscope.estimate/1"
    assert out["kv_cache_bytes"] == 32 * GiB
    assert out["weights_bytes"] == 2 * 8_030_261_248


def test_cli_explicit_numbers_and_text(capsys):
    rc = main(["estimate", "--layers", "32", "--kv-heads", "32", "--head-dim", "128",
               "--hidden", "4096", "--params", "7B", "--context", "2048", "--gpu-memory-gib",
               "80"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "KV per token          512.0 KiB" in out
    assert "weights               13.04 GiB" in out  # 7e9 x 2 bytes


def test_cli_errors(tmp_path, capsys):
    assert main(["estimate", str(tmp_path / "nope.json")]) == 2
    assert "config file not found" in capsys.readouterr().err
    assert main(["estimate", "--layers", "2"]) == 2
    assert "incomplete model shape: give --hidden and --head-dim" in capsys.readouterr().err
    assert main(["estimate", "--layers", "2", "--hidden", "64", "--head-dim", "16"]) == 2
    assert "--params" in capsys.readouterr().err


LLAMA3_FLAGS = ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--hidden", "4096",
                "--intermediate", "14336", "--vocab", "128256", "--json"]


def test_cli_flags_count_a_gated_mlp_like_the_config_file(capsys):
    """Flags alone gave 6.15 B for Llama-3-8B (a plain MLP); config.json gives 8.03 B."""
    assert main(["estimate", *LLAMA3_FLAGS, "--gpu", "H200"]) == 0
    assert json.loads(capsys.readouterr().out)["weights_bytes"] == 2 * 8_030_261_248
    assert main(["estimate", *LLAMA3_FLAGS, "--gpu", "H200", "--mlp", "plain"]) == 0
    assert json.loads(capsys.readouterr().out)["weights_bytes"] == 2 * 6_151_213_056


def test_cli_exits_1_when_the_plan_does_not_fit(capsys):
    assert main(["estimate", *LLAMA3_FLAGS, "--gpu-memory-gib", "12"]) == 1
    assert json.loads(capsys.readouterr().out)["fits"] is False
