"""The caching-allocator counter source: one device's torch allocator counters as a ``Sample``.

``torch.cuda.memory_stats()`` flattens and sorts ~120 entries under the GIL on every call; the
binding beneath it returns the same counters from C++, so the eight used are read from that
(``choose_binding``; docs/hooks.md, "Allocator counters"). All are ints >= 0 read at one instant
under the allocator's lock.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, NamedTuple

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.records import Phase, Sample, format_uuid
from vramscope.hooks.phase import current_phase, note_allocated

log = logging.getLogger("vramscope.hooks")


class Counters(NamedTuple):
    allocated: int
    allocated_peak: int
    reserved: int
    active: int
    inactive_split: int
    requested: int
    num_alloc_retries: int
    num_ooms: int


def _current(stats: Mapping[str, Any], name: str, key: str = "current") -> int:
    pools = stats.get(name)
    if not pools:
        return 0
    return int(pools["all"][key])


def counters_from_nested(stats: Mapping[str, Any]) -> Counters | None:
    """Counters from the nested dict of ``torch._C._cuda_memoryStats`` (``None`` if empty)."""
    if not stats:
        return None  # the allocator of this device was never initialized
    return Counters(
        allocated=_current(stats, "allocated_bytes"),
        allocated_peak=_current(stats, "allocated_bytes", "peak"),
        reserved=_current(stats, "reserved_bytes"),
        active=_current(stats, "active_bytes"),
        inactive_split=_current(stats, "inactive_split_bytes"),
        requested=_current(stats, "requested_bytes"),
        num_alloc_retries=int(stats.get("num_alloc_retries", 0)),
        num_ooms=int(stats.get("num_ooms", 0)),
    )


def counters_from_flat(stats: Mapping[str, Any]) -> Counters | None:
    """Counters from the flat dict of ``torch.cuda.memory_stats()`` (the slow fallback)."""
    if not stats:
        return None
    return Counters(
        allocated=int(stats.get("allocated_bytes.all.current", 0)),
        allocated_peak=int(stats.get("allocated_bytes.all.peak", 0)),
        reserved=int(stats.get("reserved_bytes.all.current", 0)),
        active=int(stats.get("active_bytes.all.current", 0)),
        inactive_split=int(stats.get("inactive_split_bytes.all.current", 0)),
        requested=int(stats.get("requested_bytes.all.current", 0)),
        num_alloc_retries=int(stats.get("num_alloc_retries", 0)),
        num_ooms=int(stats.get("num_ooms", 0)),
    )


class Binding(NamedTuple):
    """How counters are read on this torch: a name for reports and a ``device -> Counters``."""

    name: str
    read: Callable[[int], Counters | None]


def choose_binding(torch: ModuleType) -> Binding:
    """The cheapest counter binding the installed torch offers, most direct first."""
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        return Binding("torch._C._cuda_memoryStats", lambda d: counters_from_nested(raw(d)))
    device_stats = getattr(torch._C, "_accelerator_getDeviceStats", None)
    if device_stats is not None:
        return Binding("torch._C._accelerator_getDeviceStats",
                       lambda d: counters_from_nested(device_stats(d)))
    stats = torch.cuda.memory_stats
    return Binding("torch.cuda.memory_stats", lambda d: counters_from_flat(stats(d)))


def device_limit_bytes(torch: ModuleType, device: int) -> int | None:
    """Device total, or less under ``set_per_process_memory_fraction`` (what may be used)."""
    try:
        total = int(torch.cuda.get_device_properties(device).total_memory)
        get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        fraction = float(get_fraction(device)) if get_fraction else 1.0
        return int(total * fraction) if fraction < 1.0 else total
    except Exception:  # vendor calls never crash the host
        return None


def device_uuid(torch: ModuleType, device: int) -> str | None:
    """The device's UUID as NVML writes it (``GPU-...``), from torch's device properties.

    The identity the agent joins on: ``device`` is torch's *logical* index, which
    ``CUDA_VISIBLE_DEVICES`` and container runtimes renumber; the UUID is the same everywhere.
    Call only after CUDA is initialized (``get_device_properties`` would initialize it).
    """
    try:
        return format_uuid(torch.cuda.get_device_properties(device).uuid)
    except Exception:  # older torch (no .uuid), or a driver error: the index join stays
        return None


# Re-read the limit every this many reads: a server may call set_per_process_memory_fraction
# after the first read (the cap is then its limit), and the read is cheap but not free.
LIMIT_REFRESH_READS = 50


class AllocatorSource:
    """Reads one device's counters into a ``Sample`` tagged with the current phase.

    ``read()`` returns ``None`` while CUDA is not initialized in this process: reading would
    create a CUDA context (hundreds of MiB) in a server that has not asked for one yet.
    """

    source_name = "torch"

    def __init__(self, device: int = 0, *, clock: Clock = SYSTEM_CLOCK,
                 torch_module: ModuleType | None = None, binding: Binding | None = None) -> None:
        if torch_module is None:
            import torch  # noqa: PLC0415 - only where torch is wanted

            torch_module = torch
        self.device = device
        self._torch = torch_module
        self._clock = clock
        self.binding = binding or choose_binding(torch_module)
        self._pid = os.getpid()
        self._limit_bytes: int | None = None
        self._reads = 0
        self.device_uuid: str | None = None  # read once, after CUDA is initialized
        self._failures = 0

    def counters(self) -> Counters | None:
        """The raw counters now, or ``None`` (not initialized, or the read failed)."""
        try:
            if not self._torch.cuda.is_initialized():
                return None
            return self.binding.read(self.device)
        except Exception as exc:  # never into the server: log once, keep going
            self._failures += 1
            if self._failures == 1:
                log.warning("vramscope: reading allocator counters of cuda:%d failed (%s); "
                            "allocator samples will be missing", self.device, exc)
            return None

    def read(self) -> Sample | None:
        counters = self.counters()
        if counters is None:
            return None
        note_allocated(self.device, counters.allocated)
        if self._limit_bytes is None or self._reads % LIMIT_REFRESH_READS == 0:
            self._limit_bytes = device_limit_bytes(self._torch, self.device)
            if self.device_uuid is None:
                self.device_uuid = device_uuid(self._torch, self.device)
        self._reads += 1
        return sample_from_counters(counters, ts_s=self._clock.time_s(), device=self.device,
                                    phase=current_phase(), pid=self._pid,
                                    limit_bytes=self._limit_bytes,
                                    device_uuid=self.device_uuid)


def sample_from_counters(c: Counters, *, ts_s: float, device: int, phase: Phase,
                         pid: int | None, limit_bytes: int | None = None,
                         source: str = "torch", device_uuid: str | None = None) -> Sample:
    """``device_total_bytes`` of an allocator sample is the process's limit: the device total,
    or the per-process cap (``set_per_process_memory_fraction``) when one is set."""
    return Sample(ts_s=ts_s, device=device, phase=phase, source=source, pid=pid,
                  allocated_bytes=c.allocated, reserved_bytes=c.reserved,
                  active_bytes=c.active, inactive_split_bytes=c.inactive_split,
                  requested_bytes=c.requested, num_alloc_retries=c.num_alloc_retries,
                  num_ooms=c.num_ooms, device_total_bytes=limit_bytes, device_uuid=device_uuid)


class FakeAllocatorSource:
    """The real fake: an allocator whose counters the test sets; reads return them as they are.

    ``set(allocated=..., ...)`` moves the counters; ``allocated_peak`` follows ``allocated`` up
    the way the real allocator's peak does, and ``reset_peak()`` sets it back to ``allocated``.
    ``None`` counters (the default) mean "CUDA not initialized": ``read()`` returns ``None``.
    """

    source_name = "torch"

    def __init__(self, counters: Counters | None = None, *, device: int = 0,
                 clock: Clock = SYSTEM_CLOCK, pid: int | None = 4242,
                 limit_bytes: int | None = None, device_uuid: str | None = None) -> None:
        self.device = device
        self.device_uuid = device_uuid
        self.now = counters
        self._clock = clock
        self._pid = pid
        self._limit = limit_bytes
        self.reads = 0

    def set(self, **fields: int) -> None:
        base = self.now or Counters(0, 0, 0, 0, 0, 0, 0, 0)
        new = base._replace(**fields)
        if "allocated_peak" not in fields:
            new = new._replace(allocated_peak=max(base.allocated_peak, new.allocated))
        self.now = new

    def reset_peak(self, device: int = 0) -> None:
        if self.now is not None:
            self.now = self.now._replace(allocated_peak=self.now.allocated)

    def counters(self) -> Counters | None:
        self.reads += 1
        return self.now

    def read(self) -> Sample | None:
        c = self.counters()
        if c is None:
            return None
        note_allocated(self.device, c.allocated)
        return sample_from_counters(c, ts_s=self._clock.time_s(), device=self.device,
                                    phase=current_phase(), pid=self._pid,
                                    limit_bytes=self._limit, device_uuid=self.device_uuid)
