"""The OOM risk page, ``/api/v1/config-check`` and ``/metrics``: the [server] section's worst
admissible request against the device's limit, as the agent's alert engine checked it and
stored it with the device's answer (the seeded store: NVML's 80 GiB on both devices). The
dashboard's own config is not the agent's, and is never used to check again (issue 46)."""

from __future__ import annotations

import json

import pytest
from vramscope.agent.config import parse_config
from vramscope.dashboard.app import create_app

from tests.support import dashboard_fixtures as F

seeded, dash_app, client = F.seeded, F.dash_app, F.client  # shared fixtures

GIB = 2**30
LLAMA = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
         "vocab_size": 128256, "torch_dtype": "bfloat16", "max_position_embeddings": 131072}
# 32 x 16,000 tokens of Llama-3-8B's shape: 16,060,522,496 weights + 1 GiB + 67,108,864,000 KV
# + 46,137,344,000 + 32 x 128,256 x 4 activations = 130,396,889,088 bytes (121.44 GiB); the
# room after weights and overhead, 68,765,081,600 bytes, holds 19 sequences of 16,000 x
# (131,072 KV + 90,112 activation bytes) + 513,024 for logits = 3,539,457,024 bytes each.
NEEDED_32 = 130_396_889_088


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    return str(path)


def _agent(tmp_path, **server) -> F.Seeded:
    """The seeded store as an agent whose config has this ``[server]`` section wrote it."""
    return F.seed(tmp_path / "agent.db", agent_config=parse_config({"server": server}, None,
                                                                    {}))


def _client(seeded: F.Seeded, **server):
    """The dashboard over ``seeded``, its own config with this ``[server]`` section."""
    return create_app(seeded.config(server=server) if server else seeded.config(),
                      seeded.store, clock=seeded.clock).test_client()


def test_the_risk_page_says_the_worst_request_cannot_fit(tmp_path, model):
    agent = _agent(tmp_path, model=model, max_model_len=16000, max_num_seqs=32)
    html = _client(agent).get("/risk?device=0").get_data(as_text=True)
    assert ('<span class="badge warning">cannot fit</span> the worst request the server admits '
            '(32 x 16000 tokens, 512000 in one forward) cannot fit: it needs 121.44 GiB, the '
            'limit is 80.00 GiB; lower server.max_num_seqs (vLLM --max-num-seqs) to 19'
            in html)
    assert "<dt>needed</dt><dd>121.44 GiB</dd>" in html
    assert "<dt>limit</dt><dd>80.00 GiB</dd>" in html
    assert "<dt>lower</dt><dd>server.max_num_seqs to 19</dd>" in html


def test_the_risk_page_says_it_fits(tmp_path, model):
    agent = _agent(tmp_path, model=model, max_model_len=16000, max_num_seqs=16)
    html = _client(agent).get("/risk?device=1").get_data(as_text=True)
    assert ('<span class="badge ok">fits</span> the worst request the server admits (16 x 16000 '
            'tokens, 256000 in one forward) fits: it needs 68.70 GiB of the 80.00 GiB limit '
            '(11.30 GiB to spare)' in html)
    assert "<dt>lower</dt>" not in html


def test_no_server_section_in_the_agent_no_panel(seeded, model):
    """The agent checked nothing: no panel, even where the dashboard's config has a section."""
    for c in (_client(seeded), _client(seeded, model=model, max_num_seqs=32)):
        assert 'id="config-check"' not in c.get("/risk").get_data(as_text=True)
        assert c.get("/api/v1/config-check?device=1").get_json() == {"device": 1,
                                                                     "check": None}


def test_the_api_gives_the_agent_s_check_whatever_the_dashboard_s_config_says(tmp_path,
                                                                             model):
    """The agent ran with 32 sequences (cannot fit); the dashboard is given 16 (which would
    fit), or no section: both show the agent's stored check."""
    agent = _agent(tmp_path, model=model, max_model_len=16000, max_num_seqs=32)
    for c in (_client(agent), _client(agent, model=model, max_model_len=16000,
                                      max_num_seqs=16)):
        _assert_the_agent_s_check(c, model)
        html = c.get("/risk?device=0").get_data(as_text=True)
        assert "<dt>lower</dt><dd>server.max_num_seqs to 19</dd>" in html


def _assert_the_agent_s_check(c, model: str) -> None:
    doc = c.get("/api/v1/config-check?device=0").get_json()
    assert doc == {"device": 0, "check": {
        "model": model, "fits": False, "needed_bytes": NEEDED_32, "limit_bytes": 80 * GIB,
        "headroom_bytes": 80 * GIB - NEEDED_32,
        "worst_request": "32 x 16000 tokens, 512000 in one forward",
        "lower": "server.max_num_seqs", "lower_to": 19,
        "message": "the worst request the server admits (32 x 16000 tokens, 512000 in one "
                   "forward) cannot fit: it needs 121.44 GiB, the limit is 80.00 GiB; lower "
                   "server.max_num_seqs (vLLM --max-num-seqs) to 19"}}
    assert c.get("/api/v1/config-check?device=7").status_code == 404


def test_metrics_export_the_headroom_config_oom_alerts_on(tmp_path, model):
    """``vramscope_config_headroom_bytes``: the limit (80 GiB) less what 32 x 16,000 tokens
    need, per device, as the agent checked it (the dashboard's config says 16); the exported
    config_oom rule fires below 0."""
    agent = _agent(tmp_path, model=model, max_model_len=16000, max_num_seqs=32)
    text = _client(agent, model=model, max_model_len=16000, max_num_seqs=16).get(
        "/metrics").get_data(as_text=True)
    for device in (0, 1):
        assert (f'vramscope_config_headroom_bytes{{device="{device}",host="{F.HOST}"}} '
                f"{float(80 * GIB - NEEDED_32)}") in text
    assert 80 * GIB - NEEDED_32 == -44_497_543_168


def test_metrics_without_the_agent_s_check_have_no_headroom(seeded, model):
    text = _client(seeded, model=model, max_num_seqs=32).get("/metrics").get_data(as_text=True)
    assert "vramscope_config_headroom_bytes{" not in text
