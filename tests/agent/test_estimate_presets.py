"""``vramscope estimate --model NAME`` (issue 34, item 9): the common open models by name, with
their published shapes (the parameter counts below are the published ones, counted from the
shape), and a message that names the missing flag when the shape is incomplete."""

from __future__ import annotations

import json

import pytest
from vramscope.agent.cli import main
from vramscope.agent.estimate import PRESETS, GiB, preset, shape_from_hf_config

PUBLISHED = {  # parameters (biases aside, as the estimator counts), layers, KV heads, positions
    "llama-3-8b": (8_030_261_248, 32, 8, 8192),
    "llama-3.1-8b": (8_030_261_248, 32, 8, 131072),
    "llama-3-70b": (70_553_706_496, 80, 8, 8192),
    "llama-3.1-70b": (70_553_706_496, 80, 8, 131072),
    "mistral-7b": (7_248_023_552, 32, 8, 32768),
    "mixtral-8x7b": (46_702_792_704, 32, 8, 32768),
    # Qwen2.5's published 7,615,616,512 and 72,706,203,648 hold its q/k/v biases:
    # 28 x (3584 + 512 + 512) = 129,024 and 80 x (8192 + 1024 + 1024) = 819,200 of them
    "qwen2.5-7b": (7_615_616_512 - 129_024, 28, 4, 32768),
    "qwen2.5-72b": (72_706_203_648 - 819_200, 80, 8, 32768),
}


def test_the_presets_are_the_issues_models():
    assert list(PRESETS) == list(PUBLISHED)


@pytest.mark.parametrize("name", PUBLISHED)
def test_each_preset_has_its_published_shape(name):
    hf_id, cfg = preset(name)
    shape = shape_from_hf_config(cfg, hf_id)
    assert (shape.num_params, shape.num_layers, shape.num_kv_heads,
            shape.max_position_embeddings) == PUBLISHED[name]
    assert shape.head_dim == 128 and shape.dtype == "bfloat16"


def test_llama_3_8b_by_name_is_the_config_file(tmp_path, capsys):
    """The same estimate as its config.json gives (test_estimate.py's hand calculation)."""
    assert main(["estimate", "--model", "llama-3-8b", "--gpu", "H100", "--context", "8192",
                 "--concurrency", "8", "--json"]) == 0  # the old code: no --model
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == "meta-llama/Meta-Llama-3-8B"
    assert doc["weights_bytes"] == 2 * 8_030_261_248
    assert doc["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2  # 131,072
    assert doc["kv_cache_bytes"] == 131_072 * 8 * 8192 == 8 * GiB


def test_flags_override_a_preset_and_its_hugging_face_id_works_too(capsys):
    assert main(["estimate", "--model", "Qwen/Qwen2.5-72B-Instruct", "--kv-heads", "4",
                 "--json"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    assert doc["kv_bytes_per_token"] == 2 * 80 * 4 * 128 * 2


def test_an_unknown_model_lists_the_known_ones(capsys):
    assert main(["estimate", "--model", "gpt-5"]) == 2
    assert capsys.readouterr().err == (
        "vramscope: error: unknown model 'gpt-5'; known: llama-3-8b, llama-3.1-8b, llama-3-70b, "
        "llama-3.1-70b, mistral-7b, mixtral-8x7b, qwen2.5-7b, qwen2.5-72b (or give its "
        "config.json)\n")


@pytest.mark.parametrize("argv, message", [
    (["--params", "8B"], "no model shape: give --layers and --hidden and --head-dim"),
    (["--params", "8B", "--layers", "32", "--head-dim", "128"],
     "incomplete model shape: give --hidden"),  # the old code: "config has no positive
])                                              # integer hidden_size", with no config given
def test_a_missing_shape_flag_is_named(argv, message, capsys):
    assert main(["estimate", *argv]) == 2
    assert capsys.readouterr().err == (
        f"vramscope: error: {message}, or --model NAME for a known model (llama-3-8b, "
        "llama-3.1-8b, llama-3-70b, llama-3.1-70b, mistral-7b, mixtral-8x7b, qwen2.5-7b, "
        "qwen2.5-72b)\n")


def test_a_config_file_without_a_shape_key_names_the_key_and_the_flag(tmp_path, capsys):
    path = tmp_path / "partial.json"
    path.write_text('{"num_hidden_layers": 2, "num_attention_heads": 4}')
    assert main(["estimate", str(path)]) == 2
    assert capsys.readouterr().err.startswith(
        f"vramscope: error: {path} has no hidden_size: give --hidden, or --model NAME")


def test_a_config_file_and_a_model_are_one_too_many(tmp_path, capsys):
    assert main(["estimate", str(tmp_path / "c.json"), "--model", "llama-3-8b"]) == 2
    assert capsys.readouterr().err == ("vramscope: error: give a config.json or --model, not "
                                       "both\n")
