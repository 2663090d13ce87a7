"""Devices are their UUIDs (docs/architecture.md rule 6), on a fake 8-GPU node with the
FakeNvmlSource and a real SQLite store: hook records carry torch's logical index plus the UUID and
land on the physical GPU; records whose UUID names no device say so instead of landing on another
one; old index-only records keep their (host, index) join."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from vramscope.agent.config import parse_config
from vramscope.agent.daemon import Agent
from vramscope.agent.records import Event, Phase, PostMortem, Sample, format_uuid
from vramscope.agent.sources.nvml import FakeNvmlSource, fake_uuid
from vramscope.hooks.allocator import AllocatorSource, Counters
from vramscope.hooks.install_sinks import DeviceIdentitySink

GiB = 2**30


class VisibleDevicesTorch:
    """torch as a server under ``CUDA_VISIBLE_DEVICES=<physical>`` sees it: logical index i is
    physical GPU ``physical[i]``; only the UUID in the device properties says which."""

    def __init__(self, physical: list[int], initialized: bool = True) -> None:
        self._physical = physical
        self.initialized = initialized
        self.cuda = SimpleNamespace(is_initialized=lambda: self.initialized,
                                    get_device_properties=self._props,
                                    get_per_process_memory_fraction=lambda d: 1.0)

    def _props(self, i: int):
        return SimpleNamespace(uuid=fake_uuid(self._physical[i]),
                               total_memory=80 * GiB)


class ListSink:
    def __init__(self) -> None:
        self.records: list = []

    def put(self, record) -> None:
        self.records.append(record)

    def close(self) -> None:
        pass


@pytest.fixture
def node(store, fake_clock):
    """The agent of an 8-GPU node, its devices described from NVML (as at start)."""
    source = FakeNvmlSource(8, 80 * GiB, clock=fake_clock, used_fn=lambda d, t: (d + 1) * GiB)
    agent = Agent(parse_config({}, None), store=store, source=source, listen=False,
                  clock=fake_clock, alerts=False)
    agent.writer.submit(agent._describe_devices(source.devices()))
    agent.writer.flush()
    return agent


def test_format_uuid_writes_nvml_form():
    raw = SimpleNamespace(bytes=bytes(range(16)))
    assert format_uuid(raw) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    as_list = SimpleNamespace(bytes=list(range(16)))  # torch's _CUuuid.bytes
    assert format_uuid(as_list) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert format_uuid("00010203-0405-0607-0809-0A0B0C0D0E0F") == (
        "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f")
    assert format_uuid(b"MIG-1234") == "MIG-1234"
    assert format_uuid("not a uuid") is None and format_uuid(None) is None


def test_visible_devices_3_5_land_on_physical_gpus_3_and_5(node, store, fake_clock):
    torch = VisibleDevicesTorch([3, 5])
    sink = ListSink()
    hooks = DeviceIdentitySink(sink, torch)
    for logical in (0, 1):
        src = AllocatorSource(logical, clock=fake_clock, torch_module=torch,
                              binding=SimpleNamespace(name="fake", read=lambda d: Counters(
                                  (d + 1) * GiB, 0, (d + 2) * GiB, 0, 0, 0, 0, 0)))
        hooks.put(src.read())
    hooks.put(Event(fake_clock.time_s(), "phase", 1, 77, Phase.DECODE))  # stamped by the sink
    node.writer.put_many(sink.records)
    node.sample_devices()
    node.writer.flush()

    torch_rows = {(s.device, s.device_uuid, s.allocated_bytes, s.reserved_bytes)
                  for s in store.samples(source="torch")}
    assert torch_rows == {(3, "GPU-fake-0003", GiB, 2 * GiB),
                          (5, "GPU-fake-0005", 2 * GiB, 3 * GiB)}
    assert store.samples(0, source="torch") == [] and store.samples(1, source="torch") == []
    assert [(e.device, e.pid) for e in store.events(names=["phase"])] == [(5, 77)]
    assert store.unjoined_total == 0


def test_records_before_cuda_init_keep_their_index_join(store, fake_clock):
    torch = VisibleDevicesTorch([3], initialized=False)
    sink = ListSink()
    DeviceIdentitySink(sink, torch).put(Event(1.0, "phase", 0, 1, Phase.IDLE))
    assert sink.records[0].device_uuid is None  # reading the UUID would initialize CUDA


def test_unknown_uuid_on_a_taken_index_is_unjoined_not_misplaced(node, store, caplog):
    stray = Sample(1.0, 2, Phase.IDLE, "torch", 9, allocated_bytes=1, device_uuid="GPU-elsewhere")
    with caplog.at_level(logging.WARNING, "vramscope.store"):
        written = store.write([stray, stray, stray._replace(device=4)])
    assert written == 0 and store.unjoined_total == 3
    assert node.status()["unjoined_total"] == 3  # `vramscope status`, the agent's /metrics
    assert store.samples(source="torch") == []
    warnings = [r for r in caplog.records if "GPU-elsewhere" in r.getMessage()]
    assert len(warnings) == 1 and "unjoined" in warnings[0].getMessage()
    pm = PostMortem(2.0, 2, 9, Phase.IDLE, 1, 1, 1, 1, 1, None, None, device_uuid="GPU-x")
    assert store.write_postmortem(pm) is None and store.unjoined_total == 4


def test_index_only_records_join_as_before(node, store):
    store.write([Sample(1.0, 2, Phase.IDLE, "trace", allocated_bytes=5)])
    [s] = store.samples(source="trace")
    assert (s.device, s.device_uuid) == (2, "GPU-fake-0002")


def test_without_nvml_a_uuid_claims_its_index(store):
    store.write([Sample(1.0, 0, Phase.IDLE, "torch", 1, allocated_bytes=5,
                        device_uuid="GPU-aaaa")])
    store.write([Sample(2.0, 0, Phase.IDLE, "torch", 1, allocated_bytes=6)])  # index-only
    assert [(s.device, s.device_uuid, s.allocated_bytes) for s in store.samples()] == [
        (0, "GPU-aaaa", 5), (0, "GPU-aaaa", 6)]


def test_nvml_renumbering_keeps_each_uuid_history(store):
    store.describe_device(0, uuid="GPU-a", name="A")
    store.describe_device(1, uuid="GPU-b", name="B")
    store.write([Sample(1.0, 0, Phase.IDLE, "torch", 1, allocated_bytes=1, device_uuid="GPU-a"),
                 Sample(1.0, 1, Phase.IDLE, "torch", 1, allocated_bytes=2, device_uuid="GPU-b")])
    store.describe_device(0, uuid="GPU-b", name="B")  # after a reboot the order changed
    store.describe_device(1, uuid="GPU-a", name="A")
    by_uuid = {d["uuid"]: d["device_index"] for d in store.devices()}
    assert by_uuid == {"GPU-a": 1, "GPU-b": 0}
    assert {(s.device, s.allocated_bytes) for s in store.samples()} == {(1, 1), (0, 2)}


def test_a_mig_slice_is_a_device_of_its_own_named_with_its_parent(store, fake_clock):
    source = FakeNvmlSource(8, 80 * GiB, clock=fake_clock, mig={2: [10 * GiB, 20 * GiB]},
                            used_fn=lambda d, t: 7 * GiB if d >= 1000 else GiB)
    agent = Agent(parse_config({}, None), store=store, source=source, listen=False,
                  clock=fake_clock, alerts=False)
    agent.writer.submit(agent._describe_devices(source.devices()))
    agent.sample_devices()
    # a server on slice 1 of GPU 2: CUDA calls it GPU-<body>, NVML MIG-<body>
    agent.writer.put(Sample(fake_clock.time_s(), 0, Phase.IDLE, "torch", 5, allocated_bytes=3,
                            device_uuid="GPU-fake-2-1"))
    agent.writer.flush()
    slices = [d for d in store.devices() if d["parent_uuid"]]
    assert [(d["device_index"], d["uuid"], d["parent_uuid"], d["physical_index"],
             d["total_bytes"]) for d in slices] == [
        (1200, "MIG-fake-2-0", "GPU-fake-0002", 2, 10 * GiB),
        (1201, "MIG-fake-2-1", "GPU-fake-0002", 2, 20 * GiB)]
    assert len(store.devices()) == 10
    assert [(s.source, s.device_used_bytes, s.allocated_bytes)
            for s in store.samples(1201)] == [("nvml", 7 * GiB, None), ("torch", None, 3)]
    assert [s.device_used_bytes for s in store.samples(2)] == [GiB]  # the GPU keeps its own


def test_upgrade_from_0001_keeps_old_rows(tmp_path):
    from sqlalchemy import create_engine, text
    from vramscope.agent.store import Store, migrate

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    migrate.upgrade(engine, "0001")
    with engine.begin() as c:
        c.execute(text("INSERT INTO hosts (id, name, first_seen_s, last_seen_s) "
                       "VALUES (1, 'old-host', 0, 0)"))
        c.execute(text("INSERT INTO devices (id, host_id, device_index, uuid) "
                       "VALUES (1, 1, 3, 'GPU-old')"))
        c.execute(text("INSERT INTO samples (device_id, ts_s, phase, allocated_bytes) "
                       "VALUES (1, 1.0, 'idle', 11)"))
    engine.dispose()
    with Store.open(url, host_name="old-host") as store:
        assert migrate.current_revision(store.engine) == migrate.head_revision()
        assert [d["physical_index"] for d in store.devices()] == [3]
        store.write([Sample(2.0, 3, Phase.IDLE, "torch", allocated_bytes=12),
                     Sample(3.0, 0, Phase.IDLE, "torch", allocated_bytes=13,
                            device_uuid="GPU-old")])
        assert [(s.device, s.allocated_bytes) for s in store.samples()] == [
            (3, 11), (3, 12), (3, 13)]
    engine = create_engine(url)
    migrate.downgrade(engine, "0001")  # with rows that reference devices
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM samples")).scalar() == 3
    engine.dispose()


class FakeNvmlLibrary:
    """``pynvml`` as an 8-GPU node with GPU 2 in MIG mode (slices in slots 0 and 3 of 7) shows
    it: the calls NvmlSource makes, nothing else. Handles are ("gpu", i) or ("mig", i, slot)."""

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.slices = {(2, 0): 10 * GiB, (2, 3): 20 * GiB}

    def nvmlDeviceGetCount(self) -> int:
        return 8

    def nvmlDeviceGetHandleByIndex(self, i: int):
        return ("gpu", i)

    def nvmlDeviceGetName(self, h) -> str:
        return "NVIDIA H100 80GB HBM3" if h[0] == "gpu" else "NVIDIA H100 80GB HBM3 MIG 1g.10gb"

    def nvmlDeviceGetUUID(self, h) -> str:
        return f"GPU-{h[1]:08x}-0000-4000-8000-000000000000" if h[0] == "gpu" else \
            f"MIG-{h[1]:04x}{h[2]:04x}-0000-4000-8000-000000000000"

    def nvmlDeviceGetMemoryInfo(self, h):
        total = 80 * GiB if h[0] == "gpu" else self.slices[(h[1], h[2])]
        used = 30 * GiB if h == ("gpu", 2) else (GiB if h[0] == "gpu" else 4 * GiB)
        return SimpleNamespace(total=total, free=total - used, used=used)

    def nvmlDeviceGetMigMode(self, h):
        return (1, 1) if h == ("gpu", 2) else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, slot: int):
        if (h[1], slot) not in self.slices:
            raise self.NVMLError("Not Found")
        return ("mig", h[1], slot)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=4242, usedGpuMemory=4 * GiB)] if h == ("mig", 2, 3) else []


def test_nvml_source_samples_each_mig_slice_as_a_device_with_its_parent(fake_clock):
    from vramscope.agent.sources.nvml import NvmlSource

    source = NvmlSource(FakeNvmlLibrary(), fake_clock)
    infos = source.devices()
    assert [d.index for d in infos] == [0, 1, 2, 1200, 1203, 3, 4, 5, 6, 7]
    slices = [d for d in infos if d.parent_uuid]
    parent = "GPU-00000002-0000-4000-8000-000000000000"
    assert [(d.uuid, d.parent_uuid, d.physical_index, d.total_bytes) for d in slices] == [
        ("MIG-00020000-0000-4000-8000-000000000000", parent, 2, 10 * GiB),
        ("MIG-00020003-0000-4000-8000-000000000000", parent, 2, 20 * GiB)]
    used = {s.device: (s.device_uuid, s.device_used_bytes) for s in source.read()}
    assert used[2] == (parent, 30 * GiB)  # the whole GPU keeps its own series
    assert used[1203] == ("MIG-00020003-0000-4000-8000-000000000000", 4 * GiB)
    assert [(r.device, r.pid, r.device_uuid) for r in source.read_processes()] == [
        (1203, 4242, "MIG-00020003-0000-4000-8000-000000000000")]


def test_a_failed_uuid_query_does_not_retire_the_device(store):
    store.describe_device(0, uuid="GPU-a", name="A")
    store.write([Sample(1.0, 0, Phase.IDLE, "torch", 1, allocated_bytes=1, device_uuid="GPU-a")])
    store.describe_device(0, uuid=None, name="A", total_bytes=5)  # NVML's UUID query failed
    assert [(d["device_index"], d["uuid"], d["total_bytes"]) for d in store.devices()] == [
        (0, "GPU-a", 5)]


def test_a_retired_label_without_recent_data_is_not_an_overview_row(store):
    from vramscope.agent.config import parse_config
    from vramscope.dashboard.queries import device_rows

    store.describe_device(0, uuid="GPU-a")
    store.describe_device(0, uuid="GPU-b")  # another GPU took index 0: GPU-a's row retires
    assert sorted(d["device_index"] < 0 for d in store.devices()) == [False, True]
    assert [r["uuid"] for r in device_rows(store, parse_config({}, None), 10.0)] == ["GPU-b"]
