"""``vramscope estimate --tensor-parallel N`` (issue 47, item 8): one GPU's weights, KV cache,
activations and communication buffers when vLLM splits a model across N GPUs, against per-GPU
figures worked out by hand from the presets' published shapes."""

from __future__ import annotations

import json

import pytest
from vramscope.agent.cli import main
from vramscope.agent.errors import UsageError
from vramscope.agent.estimate import (
    Admission,
    GiB,
    MiB,
    Plan,
    admission_check,
    comm_buffer_bytes,
    estimate,
    gpu_memory_bytes,
    parameters_per_gpu,
    preset,
    shape_from_hf_config,
)

# Llama-3.1-70B (published config.json): 80 layers, hidden 8192, 64 attention heads, 8 KV
# heads x 128, MLP 28672, vocabulary 128256, bf16; 70,553,706,496 parameters.
REPLICATED = 80 * 2 * 8192 + 8192  # two norms a layer + the final norm = 1,318,912
KV_PROJECTIONS = 80 * 2 * 8192 * 128 * 8  # k and v of 8 KV heads = 1,342,177,280
SPLIT = 70_553_706_496 - REPLICATED - KV_PROJECTIONS  # 69,210,210,304: q, o, MLP, embeddings
# The comm buffers: vLLM's custom all-reduce (3 x 8 MiB) + 32 NCCL channels x (4 MiB Simple
# + 4,915,200 B LL128 + 524,288 B LL) = 25,165,824 + 308,281,344
COMM = 333_447_168


def llama_70b():
    hf_id, cfg = preset("llama-3.1-70b")
    return shape_from_hf_config(cfg, hf_id)


def test_llama_70b_tp4_on_an_h100_by_hand():
    plan = Plan(context_tokens=8192, concurrency=16, gpu_memory_bytes=gpu_memory_bytes("H100"),
                tensor_parallel=4)
    r = estimate(llama_70b(), plan)
    # 69,210,210,304 / 4 = 17,302,552,576 split; each GPU keeps 2 KV heads' k, v projections
    # (80 x 2 x 8192 x 128 x 2 = 335,544,320) and the norms: 17,639,415,808 x 2 bytes
    assert SPLIT // 4 + REPLICATED + KV_PROJECTIONS // 4 == 17_639_415_808
    assert r.weights_bytes == 35_278_831_616
    assert (r.tensor_parallel, r.kv_heads_per_gpu) == (4, 2)
    assert r.kv_bytes_per_token == 2 * 80 * 2 * 128 * 2 == 81_920  # a quarter of 320 KiB
    assert r.kv_cache_bytes == 81_920 * 8192 * 16 == 10 * GiB
    # 8192 x (4 x 8192 + 2 x 28672 / 4) x 2 B = 771,751,936 + 16 x 128256 x 4 B of logits
    assert r.activation_bytes == 771_751_936 + 8_208_384
    assert r.comm_buffer_bytes == COMM == 24 * MiB + 32 * 9_633_792
    assert r.total_bytes == 35_278_831_616 + GiB + COMM + 10 * GiB + 779_960_320
    assert r.total_bytes == 48_203_399_168  # 44.89 GiB of an H100's 71.68 usable
    assert r.fits and r.usable_bytes == int(81559 * MiB * 0.9) == 76_968_728_985
    # KV budget 76,968,728,985 - 35,278,831,616 - GiB - COMM - 779,960,320 = 39,503,247,905;
    # one 8192-token sequence holds 8192 x 81,920 = 671,088,640 B on each GPU: 58 of them
    assert r.max_concurrency == 39_503_247_905 // 671_088_640 == 58
    assert r.pool_blocks == 39_503_247_905 // (81_920 * 16)


def test_llama_70b_tp8_holds_one_kv_head_per_gpu():
    plan = Plan(context_tokens=8192, concurrency=16, gpu_memory_bytes=gpu_memory_bytes("H100"),
                tensor_parallel=8)
    r = estimate(llama_70b(), plan)
    # 69,210,210,304 / 8 = 8,651,276,288 + 1,318,912 + 80 x 2 x 8192 x 128 x 1 = 167,772,160
    assert parameters_per_gpu(llama_70b(), 8) == 8_820_367_360
    assert r.weights_bytes == 17_640_734_720
    assert r.kv_heads_per_gpu == 1 and r.kv_bytes_per_token == 40_960
    assert r.kv_cache_bytes == 5 * GiB
    # 8192 x (32,768 + 2 x 3584) x 2 = 654,311,424 + 8,208,384 of logits
    assert r.activation_bytes == 662_519_808
    assert r.total_bytes == 17_640_734_720 + GiB + COMM + 5 * GiB + 662_519_808


@pytest.mark.parametrize("model", ["llama-3-70b", "llama-3.1-70b"])
@pytest.mark.parametrize("tp, gpu, fits", [
    (1, "H200", False),  # 131.42 GiB of weights alone
    (4, "H100", True),  # 44.89 GiB of 71.68 usable
    (4, "L40S", False),  # 44.89 GiB of 40.49 usable
    (8, "L40S", True),  # 23.36 GiB
    (4, "A100-40GB", False),
    (8, "A100-40GB", True),  # 23.36 GiB of 36.00 usable
    (8, "L4", False),  # 23.36 GiB of 20.24 usable
])
def test_the_70b_presets_answer_for_tp_4_and_8(model, tp, gpu, fits, capsys):
    argv = ["estimate", "--model", model, "--tensor-parallel", str(tp), "--gpu", gpu,
            "--context", "8192", "--concurrency", "16"]
    assert main([*argv, "--json"]) == (0 if fits else 1)
    doc = json.loads(capsys.readouterr().out)
    assert doc["fits"] is fits and doc["tensor_parallel"] == tp
    assert doc["weights_bytes"] == {1: 141_107_412_992, 4: 35_278_831_616,
                                    8: 17_640_734_720}[tp]
    assert main(argv) == (0 if fits else 1)
    text = capsys.readouterr().out
    assert ("fits: headroom" if fits else "DOES NOT FIT: headroom") in text
    if tp > 1:
        assert (f"tensor parallel   {tp} GPUs: the figures below are one GPU's "
                f"({8 // tp} KV head{'s' if tp == 4 else ''} each)") in text
        assert "comm buffers           0.31 GiB   (all-reduce and NCCL)" in text


def test_fewer_kv_heads_than_gpus_replicates_one_on_each():
    """Qwen2.5-7B has 4 KV heads: at TP 4 each GPU holds one; Llama-3.1-70B's 8 at TP 16 are
    replicated twice (vLLM: max(1, 8 // 16) = 1 a GPU), so its k, v projections are too."""
    hf_id, cfg = preset("qwen2.5-7b")
    qwen = shape_from_hf_config(cfg, hf_id)
    assert qwen.kv_bytes_per_token(tensor_parallel=4) == 2 * 28 * 1 * 128 * 2
    shape = llama_70b()
    assert shape.kv_heads_per_gpu(16) == 1
    assert parameters_per_gpu(shape, 16) == -(-SPLIT // 16) + REPLICATED + KV_PROJECTIONS // 8
    # NCCL alone at TP 16: vLLM's custom all-reduce serves 2, 4, 6 and 8 GPUs only
    assert comm_buffer_bytes(16) == 32 * 9_633_792 and comm_buffer_bytes(1) == 0


def test_a_mixtures_router_and_norms_are_on_every_gpu():
    hf_id, cfg = preset("mixtral-8x7b")
    shape = shape_from_hf_config(cfg, hf_id)
    replicated = 32 * 2 * 4096 + 4096 + 32 * 4096 * 8  # norms, final norm, the 8-way router
    kv = 32 * 2 * 4096 * 128 * 8
    split = 46_702_792_704 - replicated - kv
    assert parameters_per_gpu(shape, 8) == split // 8 + replicated + kv // 8
    assert parameters_per_gpu(shape, 1) == 46_702_792_704  # TP 1: the whole model


def test_the_admission_check_is_per_gpu_too():
    """The worst admissible request on one GPU of four: its weights, its KV share and the
    comm buffers (the check of test_estimate_admission.py, split four ways)."""
    check = admission_check(llama_70b(), Admission(max_model_len=8192, max_num_seqs=16),
                            gpu_memory_bytes("H100"), tensor_parallel=4)
    # a whole prefill of 16 x 8192 = 131,072 tokens x 94,208 B + 8,208,384 B of logits
    assert check.prefill_tokens == 131_072
    assert check.activation_bytes == 131_072 * 94_208 + 8_208_384
    assert check.kv_bytes == 10 * GiB
    assert check.needed_bytes == 35_278_831_616 + GiB + COMM + 10 * GiB + 12_356_239_360


def test_comm_buffers_can_be_given(capsys):
    assert main(["estimate", "--model", "llama-3.1-70b", "--tensor-parallel", "8",
                 "--comm-buffer-mib", "1024", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["comm_buffer_bytes"] == GiB


@pytest.mark.parametrize("value, message", [
    ("0", "--tensor-parallel must be a positive integer (GPUs), got 0"),
    ("-4", "--tensor-parallel must be a positive integer (GPUs), got -4"),
    ("3", "--tensor-parallel 3 does not divide meta-llama/Llama-3.1-70B's 64 attention heads "
          "(each GPU takes an equal share)"),
    ("5", "--tensor-parallel 5 does not divide meta-llama/Llama-3.1-70B's 64 attention heads "
          "(each GPU takes an equal share)"),
])
def test_a_bad_tensor_parallel_size_names_the_flag(value, message, capsys):
    assert main(["estimate", "--model", "llama-3.1-70b", "--tensor-parallel", value]) == 2
    assert capsys.readouterr().err == f"vramscope: error: {message}\n"


def test_kv_heads_that_do_not_split_evenly_are_refused():
    """Qwen2.5-72B: 64 attention heads, 8 KV heads. TP 16 replicates them (16 % 8 == 0);
    a config with 6 KV heads at TP 4 splits neither way, as vLLM refuses."""
    hf_id, cfg = preset("qwen2.5-72b")
    shape = shape_from_hf_config({**cfg, "num_key_value_heads": 6}, hf_id)
    plan = Plan(context_tokens=4096, concurrency=1, gpu_memory_bytes=80 * GiB, tensor_parallel=4)
    with pytest.raises(UsageError, match=r"^--tensor-parallel 4 does not divide "
                       r"Qwen/Qwen2.5-72B-Instruct's 6 KV heads"):
        estimate(shape, plan)
    shape = shape_from_hf_config({**cfg, "num_key_value_heads": 3}, hf_id)
    with pytest.raises(UsageError, match=r"^--tensor-parallel 4 is not a multiple of "
                       r"Qwen/Qwen2.5-72B-Instruct's 3 KV heads"):
        estimate(shape, plan)


def test_the_docs_table_is_the_estimators(pytestconfig):
    """docs/estimate.md's tensor-parallel table: each row's figures as the estimator gives
    them at 8,192 tokens x 16 (the usable memory quoted for the GPUs it does not fit)."""
    doc = (pytestconfig.rootpath / "docs" / "estimate.md").read_text(encoding="utf-8")
    shape = llama_70b()
    for tp in (1, 4, 8):
        r = estimate(shape, Plan(context_tokens=8192, concurrency=16,
                                 gpu_memory_bytes=gpu_memory_bytes("H100"), tensor_parallel=tp))
        total = "—" if tp == 1 else f"{r.total_bytes / GiB:.2f} GiB"
        row = (f"| {tp} | {parameters_per_gpu(shape, tp):,} | {r.weights_bytes / GiB:.2f} GiB | "
               f"{r.kv_heads_per_gpu} | {r.kv_bytes_per_token // 1024} KiB | "
               f"{r.kv_cache_bytes // GiB} GiB | {total} |")
        assert row in doc
    for gpu in ("L40S", "L4"):
        usable = estimate(shape, Plan(context_tokens=8192, concurrency=16, tensor_parallel=8,
                                      gpu_memory_bytes=gpu_memory_bytes(gpu))).usable_bytes
        assert f"not {gpu} ({usable / GiB:.2f} GiB usable)" in doc
    assert "At TP 4 an H100 then holds at most 58 sequences of 8,192 tokens." in doc
    assert f"default ({COMM / MiB:.1f} MiB at TP 2, 4, 6 and 8; " in doc.replace("\n", " ")
