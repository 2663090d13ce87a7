"""NVML source: the whole-device view of every visible GPU, and its per-process rows.

``read()`` returns one ``Sample`` per device (``source="nvml"``, ``device_used_bytes``,
``device_total_bytes``); ``read_processes()`` returns the per-process rows at a lower rate
(``nvmlDeviceGetComputeRunningProcesses`` costs 35-210 µs a call against ~8 µs for memory info).
Never ``nvidia-smi`` (~20 ms a call, a process each time).

Memory info v2 is used where the driver has it (``nvmlDeviceGetMemoryInfo_v2``), v1 otherwise.
``device_used_bytes`` is ``total - free`` in both cases: memory the processes on this device
cannot have, which is what headroom is computed against (v2's ``used`` leaves the driver's
``reserved`` part out, v1's includes it; ``total - free`` is the same number either way).

Vendor calls never crash the agent (as ``nvmlQuery`` in nvitop): a failing call gives ``None``
for that field and one log line per (call, device), not a line per sample. When NVML itself is
absent, :func:`open_nvml` logs one line saying what to install and returns ``None``.

``FakeNvmlSource`` is the real fake used by tests, the benchmark and ``--fake-devices``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.records import Sample

log = logging.getLogger("vramscope.nvml")


class DeviceInfo(NamedTuple):
    index: int
    uuid: str | None
    name: str | None
    total_bytes: int | None


class ProcessRow(NamedTuple):
    """One NVML per-process row: a process with a context on a device."""

    ts_s: float
    device: int
    pid: int
    used_bytes: int | None  # None where the driver does not say (some vGPU / MIG setups)


class DeviceSource(Protocol):
    """The one-method seam the agent samples through (plus the slower process rows)."""

    def devices(self) -> list[DeviceInfo]: ...

    def read(self) -> list[Sample]: ...

    def read_processes(self) -> list[ProcessRow]: ...

    def close(self) -> None: ...


class NvmlSource:
    """The real thing, over ``pynvml`` (package ``nvidia-ml-py``). Build with :func:`open_nvml`."""

    def __init__(self, nvml: Any, clock: Clock = SYSTEM_CLOCK) -> None:
        self._nvml = nvml
        self._clock = clock
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i)
                         for i in range(nvml.nvmlDeviceGetCount())]
        self._memory_v2 = getattr(nvml, "nvmlMemory_v2", None)
        self._warned: set[tuple[str, int]] = set()
        self._info = [self._describe(i, h) for i, h in enumerate(self._handles)]

    def devices(self) -> list[DeviceInfo]:
        return list(self._info)

    def read(self) -> list[Sample]:
        ts_s = self._clock.time_s()
        out = []
        for index, handle in enumerate(self._handles):
            total, free = self._memory(index, handle)
            used = None if total is None or free is None else total - free
            out.append(Sample(ts_s, index, source="nvml", device_used_bytes=used,
                              device_total_bytes=total))
        return out

    def read_processes(self) -> list[ProcessRow]:
        ts_s = self._clock.time_s()
        rows = []
        for index, handle in enumerate(self._handles):
            procs = self._query("processes", index, self._nvml.nvmlDeviceGetComputeRunningProcesses,
                                handle) or []
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                rows.append(ProcessRow(ts_s, index, int(p.pid),
                                       used if isinstance(used, int) else None))
        return rows

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down; nothing to do about it
            pass

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
        return DeviceInfo(index, _text(uuid), _text(name), total)

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
    return value


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


class FakeNvmlSource:
    """A scripted fleet of devices: used memory follows ``used_fn(device, t)`` over the clock.

    The default script is a slow sine around half the memory, different per device, so plots
    and rollups have something to show; pass ``used_fn`` for exact values in tests.
    """

    def __init__(self, devices: int = 1, total_bytes: int = 80 * 2**30, *,
                 clock: Clock = SYSTEM_CLOCK,
                 used_fn: Callable[[int, float], int | None] | None = None,
                 processes: dict[int, list[tuple[int, int | None]]] | None = None) -> None:
        self._clock = clock
        self._total = total_bytes
        self._used_fn = used_fn or self._default_used
        self._processes = processes or {}  # device -> [(pid, used_bytes)]
        self._info = [DeviceInfo(i, f"GPU-fake-{i:04d}", "Fake GPU", total_bytes)
                      for i in range(devices)]
        self.reads = 0

    def devices(self) -> list[DeviceInfo]:
        return list(self._info)

    def read(self) -> list[Sample]:
        self.reads += 1
        ts_s = self._clock.time_s()
        return [Sample(ts_s, d.index, source="nvml", device_used_bytes=self._used_fn(d.index, ts_s),
                       device_total_bytes=self._total) for d in self._info]

    def read_processes(self) -> list[ProcessRow]:
        ts_s = self._clock.time_s()
        return [ProcessRow(ts_s, device, pid, used)
                for device, rows in sorted(self._processes.items()) for pid, used in rows]

    def close(self) -> None:
        pass

    def _default_used(self, device: int, t_s: float) -> int:
        wave = 0.5 + 0.25 * math.sin(t_s / 60.0 + device)
        return int(self._total * wave)
