"""The dashboard server: the bind rule inside make_server (every caller gets it), a real
waitress server in a thread."""

import json
import urllib.request

import pytest
from vramscope.agent.config import parse_config
from vramscope.agent.errors import ConfigError
from vramscope.agent.store import Store
from vramscope.dashboard.server import make_server, serve_in_thread


def test_make_server_refuses_a_public_address_without_a_token_before_opening(tmp_path):
    config = parse_config({"database": {"url": f"sqlite:///{tmp_path / 'c.db'}"}}, None, {})
    with pytest.raises(ConfigError, match="refusing to listen on '0.0.0.0' without a token"):
        make_server(config, "0.0.0.0", 0)
    assert not (tmp_path / "c.db").exists()


def test_serve_in_thread_answers_and_leaves_the_callers_store_open(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    config = parse_config({"database": {"url": url}}, None, {})
    store = Store.open(url)
    server, base = serve_in_thread(config, store, "127.0.0.1", 0, name="test-dashboard")
    try:
        assert base == f"http://127.0.0.1:{server.effective_port}/"
        with urllib.request.urlopen(base + "healthz", timeout=10) as r:
            assert json.load(r)["status"] == "ok"
    finally:
        server.close()
    assert store.safe_url  # still usable: the server never owned it
    store.close()
