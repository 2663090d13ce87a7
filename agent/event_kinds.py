"""Every event name vramscope knows, in one table: how long the store keeps it, what reads it,
and what a page calls it (docs/architecture.md, "Add an event").

An event is a name and a time (:class:`~vramscope.agent.records.Event`); clients may send names
of their own (docs/trace-format.md). What the rest of the code needs to know of a name is here
and nowhere else: retention, the per-client cap of kept events, the timeline's reads and its
marker lane, the OOM diagnosis and the saturation check each take their names from
:func:`names_with` or :func:`kind_of`, so a new name is one row of :data:`KINDS`.

A name that is not in the table (a client's own) is :data:`CHEAP`, like the requests: deleted
with the raw samples after ``retention.raw_s``, never counted against
``agent.client_max_rare_events_per_day``, and labelled with its own name. Only a listed name is
kept with the rollups, so a client cannot fill 90 days of disk with names the code never reads.
``tests/agent/test_event_kinds.py`` checks that every event name the code compares, emits or
queries resolves here.

Standard library only, like ``records``: the store, the analysis and the dashboard import it.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from vramscope.agent.records import EXIT_EVENT, RANK_EVENT, TOKENS_EVENT


class Keep(str, enum.Enum):
    """How long the store keeps an event (agent/retention.py)."""

    # as long as the raw samples (retention.raw_s, a day), counted per minute in event_counts
    # while they are listed (a week's views still show the request rate)
    CHEAP = "cheap"
    # whole, as long as the minute rollups (retention.rollup_s, 90 days): what an incident
    # review needs; bounded per client per day (agent.client_max_rare_events_per_day)
    KEPT = "kept"


CHEAP = Keep.CHEAP
KEPT = Keep.KEPT


class Role(enum.Flag):
    """What reads an event; a name may have several."""

    NONE = 0
    REQUEST = enum.auto()  # a request's start or end: request rate, in-flight count
    PHASE = enum.auto()  # a phase change: the timeline's phase bands
    MARKER = enum.auto()  # drawn on the timeline's marker lane under its label
    TIER = enum.auto()  # read with the downsampled tiers (a window too long for raw samples)
    LOAD = enum.auto()  # the timeline's load lanes: running / waiting, preemptions, tokens
    PREFIX = enum.auto()  # the timeline's prefix-cache lane: allocations and hit counts
    KV_REFUSAL = enum.auto()  # a KV pool refused blocks: part of an OOM's diagnosis
    SATURATION = enum.auto()  # the kv_saturated metric's inputs (alerts/saturation.py)
    OOM = enum.auto()  # an out-of-memory error


class EventKind(NamedTuple):
    name: str
    keep: Keep
    label: str  # what a page calls it (the timeline's marker lane, hover texts)
    roles: Role = Role.NONE


KINDS: tuple[EventKind, ...] = (
    # frequent: hundreds of thousands a device-day
    EventKind("request_start", CHEAP, "request start", Role.REQUEST | Role.MARKER),
    EventKind("request_end", CHEAP, "request end", Role.REQUEST | Role.MARKER),
    EventKind("kv_alloc", CHEAP, "KV blocks allocated", Role.PREFIX),
    EventKind("kv_free", CHEAP, "KV blocks freed"),
    # one a vLLM step that evicted cached blocks (9 a second over a recorded vLLM run,
    # tests/data/vllm_idle_server.jsonl.gz): kept, it alone would reach a client's cap of kept
    # events a day and lose its OOMs
    EventKind("kv_evicted", CHEAP, "cached KV blocks evicted"),
    EventKind("phase", CHEAP, "phase change", Role.PHASE),
    # the agent's own, one a connected process each sampling.process_interval_s (1 s): a
    # series as frequent as the raw samples, kept as long (and compacted with them); kept for
    # the rollups' 90 days it was the most of a real store's kept rows
    EventKind("nvml_process", CHEAP, "NVML process memory"),  # agent/daemon.py's PROCESS_EVENT
    # rare: what an incident review needs
    EventKind("oom", KEPT, "OOM", Role.OOM | Role.MARKER | Role.TIER),
    EventKind("kv_orphaned_blocks", KEPT, "orphaned KV blocks", Role.MARKER | Role.TIER),
    EventKind(EXIT_EVENT, KEPT, "process exit", Role.MARKER),
    EventKind(RANK_EVENT, KEPT, "process rank"),
    EventKind("kv_alloc_failed", KEPT, "KV allocation refused", Role.KV_REFUSAL),
    EventKind("kv_preempted", KEPT, "request preempted",
              Role.LOAD | Role.KV_REFUSAL | Role.SATURATION),
    # a client's own name for a preemption: the OOM diagnosis reads it, nothing of ours sends it
    EventKind("preemption", KEPT, "request preempted", Role.KV_REFUSAL),
    # at most one a LOAD_INTERVAL_S / TOKENS_EVERY_S a source (hooks/vllm_observer.py)
    EventKind("server_load", KEPT, "running and waiting requests", Role.LOAD | Role.SATURATION),
    EventKind(TOKENS_EVENT, KEPT, "tokens", Role.LOAD),
    EventKind("prefix_cache", KEPT, "prefix-cache hits", Role.PREFIX),
    EventKind("memory_layout", KEPT, "memory layout"),  # an idle point's layout (leak make-up)
    EventKind("snapshot", KEPT, "allocator snapshot"),
    EventKind("alert", KEPT, "alert"),  # a name docs/trace-format.md lists; nothing sends it now
)

BY_NAME: dict[str, EventKind] = {k.name: k for k in KINDS}


def kind_of(name: str) -> EventKind:
    """The row of ``name``; a name not listed is cheap, read by nothing, labelled as itself."""
    kind = BY_NAME.get(name)
    return kind if kind is not None else EventKind(name, CHEAP, name)


def names_with(role: Role) -> tuple[str, ...]:
    """The listed names with every bit of ``role``, in table order."""
    return tuple(k.name for k in KINDS if role in k.roles)


def names_kept(keep: Keep) -> tuple[str, ...]:
    """The listed names of one retention class, in table order."""
    return tuple(k.name for k in KINDS if k.keep is keep)


def is_kept(name: str) -> bool:
    """Whether retention keeps ``name`` with the rollups (listed as :data:`KEPT`)."""
    return kind_of(name).keep is KEPT


def label_of(name: str) -> str:
    return kind_of(name).label


# The sets the store reads by (each a range of the (device, name, time) index per name)
CHEAP_EVENTS = names_kept(CHEAP)  # retention's index-range delete and per-minute counts
KEPT_EVENTS = names_kept(KEPT)
