"""The typed records that every part of vramscope speaks (docs/architecture.md, "Data flow").

Torch's ``memory_stats()`` dict, NVML structs and KV pool internals are converted to these
records at the source, once; nothing downstream sees vendor objects.

This module depends on nothing but the standard library, so the in-server hooks, the agent,
the store and the analysis can all import it cheaply.

Units are in the field names: ``_bytes`` are integers, ``_s`` are seconds (Unix time for
timestamps, float), ``_ratio`` is a float in [0, 1]. A field that is ``None`` was not measured.
"""

from __future__ import annotations

import enum
import re
from typing import Any, NamedTuple


class Phase(str, enum.Enum):
    """What the inference server was doing when a sample was taken.

    In continuous batching one step can hold both prefill and decode work; the scheduler's
    request states, not the input length, decide which phase the step is tagged with.
    """

    PREFILL = "prefill"
    DECODE = "decode"
    IDLE = "idle"
    SETUP = "setup"  # allocating a KV pool and warming up before the first scheduled step
    UNKNOWN = "unknown"

    @classmethod
    def parse(cls, value: str | Phase) -> Phase:
        """Return the phase named ``value``; raise ``ValueError`` quoting it otherwise."""
        found = PHASE_OF.get(value) if isinstance(value, str) else None
        if found is None:
            allowed = ", ".join(p.value for p in cls)
            raise ValueError(f"unknown phase {value!r}; allowed: {allowed}")
        return found


# A phase by its stored value, or by itself (keyed by both whatever a member hashes by): the
# readers of traces, batches and rollups look one up per record.
PHASE_OF: dict[str, Phase] = {**{p.value: p for p in Phase}, **{p: p for p in Phase}}


# The store's integer columns: BigInteger (counters, bytes) and Integer (device index, pid, rank).
# Every edge that accepts records (the socket protocol, trace import, the hooks) bounds its
# integers by these, so a value one edge accepts never fails at the database.
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

# The integer counters a Sample may carry, in trace-format order. All are bytes or counts >= 0.
SAMPLE_COUNTER_FIELDS: tuple[str, ...] = (
    "allocated_bytes",  # caching allocator: handed to tensors
    "reserved_bytes",  # caching allocator: held from the driver
    "active_bytes",  # allocated plus blocks waiting on streams
    "inactive_split_bytes",  # free bytes inside partially used segments
    "requested_bytes",  # what callers asked for (allocated minus rounding)
    "largest_free_block_bytes",  # from a snapshot, when one was taken
    "num_alloc_retries",  # cumulative: cache flushed and cudaMalloc retried
    "num_ooms",  # cumulative: OOMs raised by the allocator
    "device_used_bytes",  # NVML: whole device, all processes
    "device_total_bytes",  # NVML total, or the per-process limit when one applies
    "kv_blocks_used",  # KV pool: blocks referenced by live requests
    "kv_blocks_total",  # KV pool: blocks in the pool
    "kv_blocks_cached",  # KV pool: unreferenced blocks kept for prefix reuse
    "kv_tokens_used",  # tokens whose KV the process holds for requests in flight (pool or
    #                    per-request cache); v1 extension
)


class Sample(NamedTuple):
    """One reading of memory state for one device at one time.

    A wide record: each source fills the fields it knows and leaves the rest ``None``. A
    NamedTuple (as in ``prometheus_client/samples.py``) because the hot paths create hundreds of
    thousands of these and a tuple is the cheapest immutable record Python has.
    """

    ts_s: float
    device: int = 0
    phase: Phase = Phase.UNKNOWN
    source: str | None = None
    pid: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    active_bytes: int | None = None
    inactive_split_bytes: int | None = None
    requested_bytes: int | None = None
    largest_free_block_bytes: int | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None
    device_used_bytes: int | None = None
    device_total_bytes: int | None = None
    kv_blocks_used: int | None = None
    kv_blocks_total: int | None = None
    kv_blocks_cached: int | None = None
    kv_tokens_used: int | None = None
    host: str | None = None  # None means "this host"; set by the agent for fleet databases
    # The device's identity (docs/architecture.md rule 6): NVML's UUID, "GPU-..." or "MIG-...".
    # ``device`` is then only a label (torch's logical index in a hook sample); the store joins
    # on this.
    device_uuid: str | None = None


class Event(NamedTuple):
    """Something that happened at one instant: a phase change, a request boundary, an OOM.

    Names used so far (docs/trace-format.md): ``request_start``, ``request_end`` (with
    ``request_id``), ``oom`` (with ``message`` in ``data``), ``kv_alloc``, ``kv_free``, ``phase``;
    later parts add ``kv_orphaned_blocks``, ``alert`` and ``process_exit`` (``EXIT_EVENT``).
    ``data`` holds the event's other keys, JSON-compatible.
    """

    ts_s: float
    name: str
    device: int = 0
    pid: int | None = None
    phase: Phase | None = None
    request_id: str | None = None
    data: dict[str, Any] | None = None
    host: str | None = None
    device_uuid: str | None = None  # as in Sample: the identity; ``device`` is a label


# The event a process's rank arrives in (data: rank, local_rank, world_size; hooks.identity).
RANK_EVENT = "process_rank"
# Prompt and generated tokens (data: prompt_tokens, generation_tokens, since_s: the start of the
# stretch they were counted over), from the vLLM plugin and the Prometheus source alike, at most
# one a source every TOKENS_EVERY_S: they are kept with the rollups, within a client's daily cap
# of such events (agent.client_max_rare_events_per_day) beside its OOMs.
TOKENS_EVENT = "tokens"
TOKENS_EVERY_S = 10.0
# A process says it is exiting (``vramscope.uninstall()``, which an exiting interpreter runs
# through atexit): one per device it sampled, after its sampler stopped. The alert engine ends
# the process at that instant, as it would after PROCESS_GONE_S of silence (a killed process
# sends none: silence still ends it). No data; ``pid`` is the exiting process.
EXIT_EVENT = "process_exit"


def format_uuid(value: Any) -> str | None:
    """A device UUID as NVML writes it: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``.

    Accepts NVML's own text (returned as is, ``GPU-`` or ``MIG-``), torch's ``_CUuuid``
    (``str()`` gives the bare 36 characters; ``.bytes`` the 16 bytes as a list of ints) or
    bytes. A bare UUID
    gets ``GPU-``: CUDA cannot tell a MIG slice from a GPU, so the store also tries ``MIG-``.
    ``None`` for anything else (an unknown device keeps its index join; it is never guessed).
    """
    raw = getattr(value, "bytes", None)  # torch's _CUuuid.bytes: a list of 16 ints
    if isinstance(raw, (bytes, bytearray, list, tuple)) and len(raw) == 16:
        h = bytes(raw).hex()
        value = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    elif isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("ascii", "replace")
    if value is None:
        return None
    text = str(value).strip().strip("\0")
    if text.startswith(("GPU-", "MIG-")):
        return text[:80] if len(text) > 4 else None
    return f"GPU-{text.lower()}" if _BARE_UUID.fullmatch(text) else None


def uuid_candidates(uuid: str) -> tuple[str, ...]:
    """The names one device may have: CUDA's view of a MIG slice is ``GPU-<body>`` where NVML
    says ``MIG-<body>`` (drivers >= 470), so a hook's ``GPU-`` UUID is tried both ways."""
    if uuid.startswith("GPU-"):
        return (uuid, "MIG-" + uuid[4:])
    return (uuid,)


_HEX = "[0-9A-Fa-f]"
_BARE_UUID = re.compile(f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}")


class Holder(NamedTuple):
    """One live allocation named in a post-mortem: who held the memory."""

    size_bytes: int
    frames: tuple[str, ...] = ()  # "file:line:function", innermost first; empty without history
    phase: Phase | None = None  # from _set_memory_metadata, when the allocation was stamped


class PostMortem(NamedTuple):
    """What held the memory when an allocation failed: the compact OOM summary.

    Built by the OOM observer inside the server (hooks) or by the simulator, shipped to the
    agent, stored, and shown on the dashboard. Sizes are bytes, bounded in count (top holders).
    """

    ts_s: float
    device: int
    pid: int | None
    phase: Phase
    failed_alloc_bytes: int | None  # the size of the allocation that failed
    driver_free_bytes: int | None  # what the driver said was free at the time
    device_total_bytes: int | None
    allocated_bytes: int | None
    reserved_bytes: int | None
    largest_free_block_bytes: int | None
    external_fragmentation_ratio: float | None
    requests_in_flight: tuple[str, ...] = ()
    top_holders: tuple[Holder, ...] = ()
    segments: tuple[dict[str, Any], ...] = ()  # bounded segment map: address/size/allocated
    message: str | None = None  # the allocator's own OOM message
    cause: str | None = None  # diagnosis (analysis): startup, growth, fragmentation, ...
    remedies: tuple[str, ...] = ()
    snapshot_path: str | None = None  # PyTorch snapshot pickle, when configured and kept
    host: str | None = None
    device_uuid: str | None = None  # as in Sample: the identity; ``device`` is a label

    def to_json(self) -> dict[str, Any]:
        """A JSON-compatible dict (the stored and shipped form)."""
        out = self._asdict()
        out["phase"] = self.phase.value
        out["requests_in_flight"] = list(self.requests_in_flight)
        out["top_holders"] = [
            {"size_bytes": h.size_bytes, "frames": list(h.frames),
             "phase": h.phase.value if h.phase else None}
            for h in self.top_holders
        ]
        out["segments"] = [dict(s) for s in self.segments]
        out["remedies"] = list(self.remedies)
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PostMortem:
        """Inverse of :meth:`to_json`; unknown keys are ignored."""
        fields: dict[str, Any] = {k: obj.get(k) for k in cls._fields if k in obj}
        fields["phase"] = Phase.parse(obj.get("phase") or "unknown")
        fields["requests_in_flight"] = tuple(obj.get("requests_in_flight") or ())
        fields["top_holders"] = tuple(
            Holder(int(h["size_bytes"]), tuple(h.get("frames") or ()),
                   Phase.parse(h["phase"]) if h.get("phase") else None)
            for h in obj.get("top_holders") or ()
        )
        fields["segments"] = tuple(obj.get("segments") or ())
        fields["remedies"] = tuple(obj.get("remedies") or ())
        for name in cls._fields:
            fields.setdefault(name, None)
        return cls(**fields)
