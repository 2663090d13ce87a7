"""The [server] section: parsed with errors naming the key, checked at each device's limit
(alert ``config_oom``, live in the agent and offline in analyze), logged at start-up."""

from __future__ import annotations

import json
import logging

import pytest
from vramscope.agent.alerts.config_check import (
    check_json,
    server_from_config,
)
from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.alerts.offline import analyze_records
from vramscope.agent.cli import main
from vramscope.agent.config import parse_config
from vramscope.agent.daemon import Agent
from vramscope.agent.errors import ConfigError
from vramscope.agent.records import Phase, Sample
from vramscope.agent.sources.nvml import FakeNvmlSource
from vramscope.agent.trace import write_trace

GiB = 2**30
# Llama-3-8B's shape: 8,030,261,248 parameters counted from it (bf16: 16,060,522,496 bytes),
# KV 2 x 32 x 8 x 128 x 2 = 131,072 bytes a token, activations (4 x 4096 + 2 x 14336) x 2 =
# 90,112 bytes a token. 16 x 16,000 tokens in one forward: KV 33,554,432,000, activations
# 23,068,672,000 + 16 x 128,256 x 4 logits = 23,076,880,384; + 1 GiB overhead: 73,765,576,704
# bytes = 68.70 GiB.
LLAMA = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
         "vocab_size": 128256, "torch_dtype": "bfloat16", "max_position_embeddings": 131072}
NEEDED = 73_765_576_704
# A toy in float32 with exact numbers: 1e6 parameters = 4,000,000 bytes; KV 2 x 2 x 2 x 16 x 4
# = 512 bytes a token; activations (4 x 64 + 2 x 128) x 4 = 2,048 bytes a token.
TOY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
       "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 1000,
       "torch_dtype": "float32", "num_parameters": 1_000_000, "max_position_embeddings": 1000}


@pytest.fixture
def model_dir(tmp_path):
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    return folder


def _server(model, **keys):
    return parse_config({"server": {"model": str(model), **keys}}, "vramscope.toml", {})


def _cfg(tmp_path, cfg, **keys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return _server(path, **keys)


# --- parsing ----------------------------------------------------------------------------------
@pytest.mark.parametrize("table, error", [
    ({"max_batch_tokens": 8192}, "vramscope.toml: unknown key 'server.max_batch_tokens' (did you "
                                 "mean 'server.max_num_batched_tokens'?)"),
    ({"max_num_seqs": -1}, "vramscope.toml: server.max_num_seqs = -1 is out of range; allowed: "
                           "0 to 1e+07"),
    ({"max_model_len": "16k"}, "vramscope.toml: server.max_model_len must be an integer, got "
                               "'16k'"),
    ({"kv_cache_dtype": "fp9"}, "vramscope.toml: server.kv_cache_dtype = 'fp9': unknown dtype; "
                                "expected auto or one of "),
])
def test_a_bad_server_key_is_an_error_naming_it(table, error):
    with pytest.raises(ConfigError) as info:
        parse_config({"server": table}, "vramscope.toml", {})
    assert str(info.value).startswith(error)


def test_a_model_without_max_num_seqs_is_an_error_naming_the_key(model_dir):
    with pytest.raises(ConfigError) as info:
        AlertEngine.from_config(_server(model_dir))
    assert str(info.value) == ("vramscope.toml: server.max_num_seqs must be set with "
                               "server.model (vLLM's --max-num-seqs; vLLM logs its value at "
                               "start-up)")


def test_a_missing_model_config_is_an_error_naming_the_key(tmp_path):
    with pytest.raises(ConfigError) as info:
        server_from_config(_server(tmp_path / "nope", max_num_seqs=16))
    assert str(info.value) == (f"vramscope.toml: server.model = '{tmp_path / 'nope'}': "
                               f"{tmp_path / 'nope'}: config file not found")


def test_no_model_no_check_and_no_rule():
    config = parse_config({}, None, {})
    assert server_from_config(config) is None
    assert "config_oom" not in [r.name for r in AlertEngine.from_config(config).rules]


def test_the_model_folder_and_vllm_defaults(model_dir):
    limits = server_from_config(_server(model_dir, max_num_seqs=16,
                                        kv_cache_dtype="fp8_e4m3"))
    assert limits is not None
    assert limits.admission.max_model_len == 131072  # the model's, as vLLM does
    assert limits.admission.max_batch_tokens is None and limits.admission.kv_pool_bytes is None
    assert limits.shape.kv_bytes_per_token(limits.kv_dtype) == 65_536  # fp8: one byte


def test_a_hugging_face_model_id_is_read_from_the_local_cache(tmp_path):
    repo = tmp_path / "hub" / "models--meta-llama--Meta-Llama-3-8B"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text(json.dumps(LLAMA))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    config = _server("meta-llama/Meta-Llama-3-8B", max_num_seqs=16)
    for environ in ({"HF_HUB_CACHE": str(tmp_path / "hub")}, {"HF_HOME": str(tmp_path)}):
        limits = server_from_config(config, environ)
        assert limits is not None and limits.shape.num_params == 8_030_261_248
    with pytest.raises(ConfigError) as info:
        server_from_config(config, {"HF_HUB_CACHE": str(tmp_path / "elsewhere")})
    assert str(info.value) == ("vramscope.toml: server.model = 'meta-llama/Meta-Llama-3-8B': "
                               "meta-llama/Meta-Llama-3-8B: config file not found")


# --- the check --------------------------------------------------------------------------------
def test_the_toy_checks_to_the_byte(tmp_path):
    limits = server_from_config(_cfg(tmp_path, TOY, max_num_seqs=4, overhead_gib=0))
    assert limits is not None
    check = limits.check(10_000_000)
    # 4,000,000 weights + 4 x 1,000 x 512 KV + 4,000 x 2,048 + 4 x 1,000 x 4 activations
    assert (check.kv_bytes, check.activation_bytes, check.needed_bytes) == (
        2_048_000, 8_208_000, 14_256_000)
    # room 6,000,000; a sequence costs 1,000 x (512 + 2,048) + 4,000 = 2,564,000: two fit
    assert (check.fits, check.lower, check.lower_to) == (False, "max_num_seqs", 2)
    pooled = server_from_config(_cfg(tmp_path, TOY, max_num_seqs=4, overhead_gib=0,
                                     max_num_batched_tokens=4000, kv_pool_gib=2_048_000 / GiB))
    assert pooled is not None
    # the pool is fixed: only the forward's tokens can give; (6,000,000 − 2,048,000 − 16,000)
    # // 2,048 = 1,921 tokens
    assert pooled.check(10_000_000).lower_to == 1921


def test_the_message_names_the_setting_and_vllms_flag(model_dir):
    limits = server_from_config(_server(model_dir, max_model_len=16000, max_num_seqs=16))
    assert limits is not None
    check = limits.check(40 * GiB)
    assert check.needed_bytes == NEEDED
    assert limits.message(check) == (
        "the worst request the server admits (16 x 16000 tokens, 256000 in one forward) "
        "cannot fit: it needs 68.70 GiB, the limit is 40.00 GiB; lower server.max_num_seqs "
        "(vLLM --max-num-seqs) to 7")
    assert limits.message(limits.check(80 * GiB)) == (
        "the worst request the server admits (16 x 16000 tokens, 256000 in one forward) fits: "
        "it needs 68.70 GiB of the 80.00 GiB limit (11.30 GiB to spare)")
    doc = check_json(limits, 40 * GiB)
    assert (doc["fits"], doc["lower"], doc["lower_to"], doc["headroom_bytes"]) == (
        False, "server.max_num_seqs", 7, 40 * GiB - NEEDED)


# --- the alert --------------------------------------------------------------------------------
def _nvml(ts, total):
    return Sample(ts, 0, Phase.UNKNOWN, "nvml", device_used_bytes=20 * GiB,
                  device_total_bytes=total)


def _torch(ts, cap):
    return Sample(ts, 0, Phase.IDLE, "torch", pid=7, allocated_bytes=18 * GiB,
                  reserved_bytes=19 * GiB, device_total_bytes=cap)


def test_config_oom_fires_once_the_limit_is_known_and_a_cap_wins(model_dir):
    engine = AlertEngine.from_config(_server(model_dir, max_model_len=16000, max_num_seqs=16))
    assert engine.feed([_nvml(1.0, 80 * GiB)]) == []  # 68.70 GiB fits in the device's 80
    changes = engine.feed([_torch(2.0, 40 * GiB), _nvml(3.0, 80 * GiB), _torch(4.0, 40 * GiB)])
    assert [(c.kind, c.rule, c.severity, c.ts_s, c.value) for c in changes] == [
        ("fired", "config_oom", "warning", 2.0, float(40 * GiB - NEEDED))]
    assert changes[0].message.endswith("the limit is 40.00 GiB; lower server.max_num_seqs "
                                       "(vLLM --max-num-seqs) to 7")


MESSAGE_40 = ("the worst request the server admits (16 x 16000 tokens, 256000 in one forward) "
              "cannot fit: it needs 68.70 GiB, the limit is 40.00 GiB; lower server.max_num_seqs "
              "(vLLM --max-num-seqs) to 7")


def test_offline_analyze_reports_config_oom(model_dir):
    config = _server(model_dir, max_model_len=16000, max_num_seqs=16)
    doc = analyze_records([_nvml(10.0, 40 * GiB), _nvml(11.0, 40 * GiB)], [], config)
    assert doc["alerts"] == [{"rule": "config_oom", "severity": "warning", "device": 0,
                              "fired_ts": 10.0, "resolved_ts": None}]
    check = doc["devices"]["0"]["config_check"]
    assert (check["fits"], check["limit_bytes"], check["needed_bytes"], check["message"]) == (
        False, 40 * GiB, NEEDED, MESSAGE_40)
    plain = analyze_records([_nvml(10.0, 40 * GiB)], [], parse_config({}, None, {}))
    assert plain["alerts"] == [] and "config_check" not in plain["devices"]["0"]


def test_the_analyze_command_prints_the_check(model_dir, tmp_path, capsys):
    trace, toml = tmp_path / "run.jsonl", tmp_path / "vramscope.toml"
    with open(trace, "w") as fh:
        write_trace(fh, [_nvml(10.0, 40 * GiB), _nvml(11.0, 40 * GiB)], [])
    toml.write_text(f'[server]\nmodel = "{model_dir}"\nmax_model_len = 16000\n'
                    'max_num_seqs = 16\n')
    assert main(["analyze", str(trace), "--config", str(toml)]) == 0
    out = capsys.readouterr().out
    assert f"config check, device 0: {MESSAGE_40}\n" in out
    assert "config_oom" in out  # the alert, as the live agent raised it


def test_the_agent_logs_the_check_at_start_and_stores_the_alert(model_dir, store, fake_clock,
                                                               caplog):
    config = _server(model_dir, max_model_len=16000, max_num_seqs=16)
    source = FakeNvmlSource(1, 40 * GiB, clock=fake_clock, used_fn=lambda d, t: 20 * GiB)
    agent = Agent(config, store=store, source=source, listen=False, clock=fake_clock)
    with caplog.at_level(logging.INFO, logger="vramscope.agent"):
        agent.start()
        try:
            agent.sample_devices()  # the first NVML sample: the device's limit
        finally:
            agent.stop()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and r.getMessage().startswith("config check")]
    assert warned == ["config check, device 0: the worst request the server admits (16 x 16000 "
                      "tokens, 256000 in one forward) cannot fit: it needs 68.70 GiB, the limit "
                      "is 40.00 GiB; lower server.max_num_seqs (vLLM --max-num-seqs) to 7"]
    stored = store.alerts()
    assert [(a["rule"], a["severity"], a["message"]) for a in stored] == [
        ("config_oom", "warning", warned[0].removeprefix("config check, device 0: "))]


def test_config_check_reads_the_server_section(model_dir, tmp_path, capsys):
    toml = tmp_path / "vramscope.toml"
    toml.write_text(f'[server]\nmodel = "{model_dir}"\nmax_model_len = 16000\n')
    assert main(["config", "check", str(toml)]) == 1
    assert capsys.readouterr().err == (
        f"vramscope: error: {toml}: server.max_num_seqs must be set with server.model (vLLM's "
        "--max-num-seqs; vLLM logs its value at start-up)\n")
    toml.write_text(f'[server]\nmodel = "{model_dir}"\nmax_model_len = 16000\n'
                    'max_num_seqs = 16\n')
    assert main(["config", "check", str(toml)]) == 0
    assert capsys.readouterr().out.endswith(f", [server] 16 x 16000 tokens of {model_dir})\n")
