"""install_embedded(): the agent side composes embedded mode (the hooks never import the agent):
a real embedded agent over SQLite, the real hooks, the records in the store."""

from __future__ import annotations

import pytest
from vramscope.agent.config import parse_config
from vramscope.agent.embedded import install_embedded
from vramscope.agent.records import Phase
from vramscope.agent.store import Store
from vramscope.hooks import install as hooks_install

import vramscope


@pytest.fixture(autouse=True)
def clean():
    hooks_install.uninstall()
    yield
    hooks_install.uninstall()


def test_install_embedded_writes_phase_events_to_the_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'v.db'}"
    config = parse_config({"database": {"url": url}}, None, {})
    embedded = vramscope.install_embedded(config)  # the facade's lazy export
    assert embedded.report.active("sink") and embedded.report.active("embedded_agent")
    assert embedded.report.detail("sink") == "given: WriterSink"
    vramscope.set_phase("prefill")
    vramscope.set_phase("decode")
    embedded.stop()  # hooks off, then the agent's final flush
    assert not hooks_install.installed()
    store = Store.open(url)
    try:
        names = [(e.name, e.phase) for e in store.events()]
    finally:
        store.close()
    assert names == [("phase", Phase.PREFILL), ("phase", Phase.DECODE)]


def test_an_agent_that_cannot_start_is_a_report_line_not_an_exception(tmp_path):
    # a database the settings accept, whose driver is not installed: the store refuses it
    # (a database vramscope does not store to is refused with the settings: issue 45, item 7)
    config = parse_config({"database": {"url": "postgresql+nosuchdriver://x/y"}}, None, {})
    with install_embedded(config) as embedded:
        assert embedded.agent is None
        assert not embedded.report.active("embedded_agent")
        assert ("database URL 'postgresql+nosuchdriver://x/y': needs the 'nosuchdriver' driver"
                in embedded.report.detail("embedded_agent"))
        assert embedded.report.detail("sink") == "given: DropSink"
        vramscope.set_phase("prefill")  # counted and dropped, never raised
    assert not hooks_install.installed()


def test_a_second_call_starts_no_second_agent(tmp_path):
    config = parse_config({"database": {"url": f"sqlite:///{tmp_path / 'v.db'}"}}, None, {})
    with install_embedded(config) as first:
        second = install_embedded(config)
        assert second.agent is None
        assert second.report.detail("install").startswith("already installed")
        assert first.agent is not None
