"""NVML device memory: the whole-device view, sampled in the agent (docs/agent.md, "NVML").

``read()`` returns one ``Sample`` per device, ``read_processes()`` the per-process rows at a lower
rate. Never ``nvidia-smi``; a failing vendor call gives ``None`` for its field and one log line.
``FakeNvmlSource`` is the real fake used by tests, the benchmark and ``--fake-devices``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple, Protocol

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.records import Sample

log = logging.getLogger("vramscope.nvml")


# MIG slices have no NVML index of their own; the agent numbers them after the GPUs so that a
# device is still addressable by one integer: slot s of GPU g is MIG_INDEX_BASE + 100 * g + s
# (GPU 3's slot 2 is 1302). The label only: the identity is the slice's own UUID.
MIG_INDEX_BASE = 1000


def mig_index(parent_index: int, slot: int) -> int:
    return MIG_INDEX_BASE + 100 * parent_index + slot


class DeviceInfo(NamedTuple):
    # NVML's physical index; for a MIG slice, mig_index(parent, slot). (It shadows tuple.index.)
    index: int  # type: ignore[assignment]
    uuid: str | None
    name: str | None
    total_bytes: int | None
    parent_uuid: str | None = None  # a MIG slice's GPU
    physical_index: int | None = None  # the GPU's NVML index (a slice's parent's)


class ProcessRow(NamedTuple):
    """One NVML per-process row: a process with a context on a device."""

    ts_s: float
    device: int
    pid: int  # as NVML sees it: the host's PID namespace (or the agent's, in a container)
    used_bytes: int | None  # None where the driver does not say (some vGPU / MIG setups)
    device_uuid: str | None = None


class DeviceSource(Protocol):
    """The one-method seam the agent samples through (plus the slower process rows)."""

    def devices(self) -> list[DeviceInfo]: ...

    def read(self) -> list[Sample]: ...

    def read_processes(self) -> list[ProcessRow]: ...

    def close(self) -> None: ...


class NvmlSource:
    """The real thing, over ``pynvml`` (package ``nvidia-ml-py``). Build with :func:`open_nvml`.

    Every GPU is a device; on a GPU in MIG mode each MIG slice is a device too (its own UUID,
    memory and processes), named with its parent, so a server on a slice never shares a series
    with the whole GPU.
    """

    def __init__(self, nvml: ModuleType, clock: Clock = SYSTEM_CLOCK) -> None:
        self._nvml = nvml
        self._clock = clock
        self._memory_v2 = getattr(nvml, "nvmlMemory_v2", None)
        self._warned: set[tuple[str, int]] = set()
        gpus = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self._handles: list[tuple[DeviceInfo, Any]] = []
        for i, handle in enumerate(gpus):
            info = self._describe(i, handle)
            self._handles.append((info, handle))
            self._handles += self._mig_slices(info, handle)
        self._info = [info for info, _ in self._handles]

    def devices(self) -> list[DeviceInfo]:
        return list(self._info)

    def read(self) -> list[Sample]:
        ts_s = self._clock.time_s()
        out = []
        for info, handle in self._handles:
            total, free = self._memory(info.index, handle)
            used = None if total is None or free is None else total - free
            out.append(Sample(ts_s, info.index, source="nvml", device_used_bytes=used,
                              device_total_bytes=total, device_uuid=info.uuid))
        return out

    def read_processes(self) -> list[ProcessRow]:
        ts_s = self._clock.time_s()
        rows = []
        for info, handle in self._handles:
            procs = self._query("processes", info.index,
                                self._nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                rows.append(ProcessRow(ts_s, info.index, int(p.pid),
                                       used if isinstance(used, int) else None, info.uuid))
        return rows

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down; nothing to do about it
            pass

    def _mig_slices(self, gpu: DeviceInfo, handle: Any) -> list[tuple[DeviceInfo, Any]]:
        """The MIG slices of one GPU in MIG mode (none otherwise, or on an older driver)."""
        nvml, index = self._nvml, gpu.index
        if not hasattr(nvml, "nvmlDeviceGetMigMode"):
            return []
        mode = self._query("mig_mode", index, nvml.nvmlDeviceGetMigMode, handle)
        if not mode or not mode[0]:  # (current, pending); 1 is NVML_DEVICE_MIG_ENABLE
            return []
        count = self._query("mig_count", index, nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        out = []
        for slot in range(count):
            try:  # an empty slot raises NVML_ERROR_NOT_FOUND: expected, not worth a log line
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except Exception:  # noqa: BLE001
                continue
            info = self._describe(mig_index(index, slot), mig)
            out.append((info._replace(parent_uuid=gpu.uuid, physical_index=index), mig))
        return out

    def _memory(self, index: int, handle: Any) -> tuple[int | None, int | None]:
        info = None
        if self._memory_v2 is not None:
            info = self._query("memory_v2", index, self._nvml.nvmlDeviceGetMemoryInfo, handle,
                               version=self._memory_v2)
            if info is None:  # driver without the v2 entry point: use v1 from now on
                self._memory_v2 = None
        if info is None:
            info = self._query("memory", index, self._nvml.nvmlDeviceGetMemoryInfo, handle)
        if info is None:
            return None, None
        return int(info.total), int(info.free)

    def _describe(self, index: int, handle: Any) -> DeviceInfo:
        name = self._query("name", index, self._nvml.nvmlDeviceGetName, handle)
        uuid = self._query("uuid", index, self._nvml.nvmlDeviceGetUUID, handle)
        total, _ = self._memory(index, handle)
        return DeviceInfo(index, _text(uuid), _text(name), total, physical_index=index)

    def _query(self, what: str, index: int, fn: Callable[..., Any], *args: Any,
               **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - NVMLError and ctypes errors alike
            if (what, index) not in self._warned:
                self._warned.add((what, index))
                level = logging.DEBUG if what == "memory_v2" else logging.WARNING
                log.log(level, "NVML %s query failed on device %d (%s); reporting None",
                        what, index, exc)
            return None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    text: str | None = value  # NVML's str, or None
    return text


def open_nvml(clock: Clock = SYSTEM_CLOCK) -> NvmlSource | None:
    """The NVML source, or ``None`` with one log line saying why (no package, no driver)."""
    try:
        import pynvml
    except ImportError:
        log.warning("NVML sampling is off: the nvidia-ml-py package is not installed "
                    "(pip install nvidia-ml-py)")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.warning("NVML sampling is off: cannot initialise NVML (%s); is the NVIDIA driver "
                    "installed and a GPU visible?", exc)
        return None
    try:
        return NvmlSource(pynvml, clock)
    except Exception as exc:  # noqa: BLE001
        log.warning("NVML sampling is off: cannot enumerate devices (%s)", exc)
        return None


def fake_uuid(index: int) -> str:
    return f"GPU-fake-{index:04d}"


class FakeNvmlSource:
    """A scripted node: used memory follows ``used_fn(device, t)`` over the clock.

    The default script is a slow sine around half the memory, different per device, so plots
    and rollups have something to show; pass ``used_fn`` for exact values in tests.
    ``mig={gpu: [slice_total_bytes, ...]}`` puts those GPUs in MIG mode with one slice per
    entry (indexes from :func:`mig_index`, UUIDs ``MIG-fake-<gpu>-<slot>``), as NVML shows them.
    ``processes`` maps a device index (a slice's too) to its ``(pid, used_bytes)`` rows.
    """

    def __init__(self, devices: int = 1, total_bytes: int = 80 * 2**30, *,
                 clock: Clock = SYSTEM_CLOCK,
                 used_fn: Callable[[int, float], int | None] | None = None,
                 processes: dict[int, list[tuple[int, int | None]]] | None = None,
                 mig: dict[int, list[int]] | None = None, name: str = "Fake GPU") -> None:
        self._clock = clock
        self._total = total_bytes
        self._used_fn = used_fn or self._default_used
        self.processes = processes or {}  # device -> [(pid, used_bytes)]; tests may change it
        self._info: list[DeviceInfo] = []
        for i in range(devices):
            self._info.append(DeviceInfo(i, fake_uuid(i), name, total_bytes, physical_index=i))
            for slot, slice_total in enumerate((mig or {}).get(i, ())):
                self._info.append(DeviceInfo(mig_index(i, slot), f"MIG-fake-{i}-{slot}",
                                             f"{name} MIG slice", slice_total, fake_uuid(i), i))
        self.reads = 0

    def devices(self) -> list[DeviceInfo]:
        return list(self._info)

    def read(self) -> list[Sample]:
        self.reads += 1
        ts_s = self._clock.time_s()
        return [Sample(ts_s, d.index, source="nvml", device_used_bytes=self._used_fn(d.index, ts_s),
                       device_total_bytes=d.total_bytes, device_uuid=d.uuid) for d in self._info]

    def read_processes(self) -> list[ProcessRow]:
        ts_s = self._clock.time_s()
        uuids = {d.index: d.uuid for d in self._info}
        return [ProcessRow(ts_s, device, pid, used, uuids.get(device))
                for device, rows in sorted(self.processes.items()) for pid, used in rows]

    def close(self) -> None:
        pass

    def _default_used(self, device: int, t_s: float) -> int:
        total = next((d.total_bytes for d in self._info if d.index == device), self._total)
        wave = 0.5 + 0.25 * math.sin(t_s / 60.0 + device)
        return int((total or self._total) * wave)
