"""What the store's reader (:mod:`vramscope.agent.store.reader`) is asked and answers: the
:class:`Span` a question is about, and the answers, each saying which tier answered it.

Here rather than in the reader because the reader's private parts build some of these answers
(``process_series`` makes a :class:`ProcessWindow`) and must not import the reader that
imports them. No function here reads anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from vramscope.agent.records import Event, Sample


@dataclass(frozen=True)
class Span:
    """One device's window, [start_s, end_s], and optionally one of its processes."""

    device: int  # the device index on ``host``
    start_s: float
    end_s: float
    host: str | None = None  # None: the store's own host
    # a pid: answers about that process only, where the store can tell it apart (raw samples
    # keep the pid; the per-second tier and the rollups do not); None: every process
    process: int | None = None


class Series(NamedTuple):
    """Per-bucket minima, maxima and last values of a window's counters (``rows``, as
    ``Store.timeline`` gives them) on a grid of ``bucket_s`` buckets from ``start_s``."""

    rows: list[dict[str, Any]]
    start_s: float  # the grid's first bucket (at or before the span's start)
    bucket_s: float
    tier: str  # "raw samples grouped in SQL", "per-second tier", "per-minute rollups", ...


class Window(NamedTuple):
    """The records a model analyses, and the tier they were read from."""

    samples: list[Sample]
    events: list[Event]
    tier: str  # "raw samples", "per-second tier[, then raw samples]", or how buckets were made
    bucket_s: float | None = None  # None: raw samples; 1.0: (partly) the per-second tier


class Bands(NamedTuple):
    """A window's phases: exact ``bands`` (``{"phase", "start", "end"}``) or, where they would
    be more than asked for, each phase's ``shares`` per bucket; ``tier`` where they came from
    (or what to do to see them)."""

    bands: list[dict[str, Any]]
    shares: dict[str, list[Any]] | None
    tier: str


class RequestRate(NamedTuple):
    """Requests started per minute on a grid of whole minutes."""

    bucket_s: float
    ts: list[float]  # each bucket's start
    per_min: list[float]
    tier: str  # "event counts", "raw events", or "event counts, then raw events"

    def document(self) -> dict[str, Any]:
        """The timeline document's ``request_rate`` (docs/api.md): the tier is not part of it."""
        return {"bucket_s": self.bucket_s, "ts": self.ts, "per_min": self.per_min}


class Peaks(NamedTuple):
    """Each column's greatest value over a window read from ``from_s`` on."""

    values: dict[str, Any]  # column -> its peak (None: never measured)
    from_s: float  # where the read began: a ten-minute boundary at or before the span's start
    tier: str


PROCESS_COLUMNS: tuple[str, ...] = ("allocated_bytes", "reserved_bytes")
# Each process's KV pool: read apart from the allocator's columns, because a device's pools
# differ in size (a 63-block pool beside a 16,384-block one) and the tiers' range over them is
# nobody's pool; one pool a process (vLLM, KVSource), so the pid is the pool's identity
KV_PROCESS_COLUMNS: tuple[str, ...] = ("kv_blocks_used", "kv_blocks_total")
# Why part of a window has no per-process series
UNREAD_TIERS = "tiers"  # raw samples gone there (retention): only the tiers, without a pid
UNREAD_LIMIT = "limit"  # more raw rows than the limit the series were read under


class ProcessSeries(NamedTuple):
    pid: int | None  # None: allocator samples that carried no pid (a trace, a simulator)
    last_ts_s: float  # its newest allocator sample in the window
    rows: list[dict[str, Any]]  # per bucket with samples: ts_s, <col>_min, <col>_max


class ProcessWindow(NamedTuple):
    """Each process's allocator series where raw samples keep the pid (the tiers keep none)."""

    series: list[ProcessSeries]  # by pid: the newest processes, a bounded number
    truncated: bool  # more processes than drawn in the raw part
    from_s: float | None  # the series cover [from_s, end]; None: none read
    newest_ts_s: float | None  # the device's newest sample (any source) in the raw part
    pids: list[int | None]  # every process known to have sent allocator samples in the window
    unread: str | None  # why [start, from_s) (or all of it) has none: UNREAD_TIERS, _LIMIT
    raw_from_s: float | None  # the device's first raw sample (None: it has none)
    names: dict[int, dict[str, Any]]  # the host's processes table, by pid
    raw_limit: int  # raw rows grouped by process, at most (UNREAD_LIMIT past it)

    @property
    def tier(self) -> str:
        """Where the per-process series came from (the tiers keep no pid: none from them)."""
        if self.from_s is None:
            return "none: more raw samples than the limit" if self.unread == UNREAD_LIMIT \
                else "none: only the tiers, which keep no process"
        return "raw samples grouped in SQL"


class Timeline(NamedTuple):
    """Everything one timeline request reads (:func:`vramscope.agent.store.reader.timeline`),
    each part with its own tier where it has one."""

    series: Series
    phases: Bands
    rate: RequestRate
    processes: ProcessWindow
    rare: list[Event]  # OOMs and orphaned blocks, at most the points asked for
    requests: list[Event]  # request starts and ends; empty when more than the points asked
    requests_truncated: bool
    load: list[Event]  # server load, preemptions and token counts, bounded
    load_truncated: bool
    prefix: list[Event] | None  # request allocations (prefix-cache hits); None: too many
    alerts: list[dict[str, Any]]  # the device's alerts fired in the window, newest first
    kv_pools: ProcessWindow | None = None  # each process's KV pool (KV_PROCESS_COLUMNS)


class FleetDevice(NamedTuple):
    """One device of a fleet as :func:`vramscope.agent.store.reader.fleet` reads it."""

    host: str
    device: int  # its index on the host
    name: str | None  # the GPU's model, as NVML names it
    uuid: str | None
    total_bytes: int | None
    newest_ts_s: float | None  # its newest sample not ahead of the read's time (None: none)
    processes: list[dict[str, Any]]  # its running processes' stored answers, device first


class DeviceNow(NamedTuple):
    """One device of a fleet as :func:`vramscope.agent.store.reader.fleet_samples` reads it."""

    device: dict[str, Any]  # its devices row with its host name, as ``Store.devices`` gives it
    span: tuple[float, float] | None  # its first and newest sample, as ``Store.time_range``'s
    # of its samples of the window up to the span's end, those that hold each (source, pid)'s
    # newest values (fleet.newest_values), in time order
    recent: list[Sample]


class Fleet(NamedTuple):
    """Every device of every host, and each host's newest agent report (by host name)."""

    devices: list[FleetDevice]  # by host, then index
    reports: dict[str, dict[str, Any]]
