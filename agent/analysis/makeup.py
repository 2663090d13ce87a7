"""A leak's make-up: the allocations that make up the idle floor's growth, named.

``diff_layouts`` compares two ``memory_layout`` events (``vramscope.hooks.idle_layout``) and
reports what is new in the later one, grouped by block size, phase and stack (streams counted,
not listed), largest first, and the new segments by size; ``pick_layouts`` chooses the two idle
points (the last one at or before the rise began, and the latest). One signature is diagnosed:
**the cuBLAS workspace cached per stream** (N >= 2 new blocks of exactly one workspace, each on
its own new stream, at least half of the new bytes), the growth of a server that runs each call
on a new CUDA stream. docs/analysis.md, "Leak make-up".

Pure: no I/O, no clock. ``layout_from_event`` turns an event's data into typed records once and
raises ``ValueError`` naming the key and the event's time when the data is malformed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from vramscope.agent.records import Event
from vramscope.agent.timefmt import iso_utc

LAYOUT_EVENT = "memory_layout"
MAX_ROWS = 20
MIB = 2**20
# torch's default cuBLAS workspace: ":4096:8" on sm90, ":4096:2:16:8" before (CublasHandlePool)
DEFAULT_WORKSPACE_BYTES = (4096 * 1024 * 8, 4096 * 1024 * 2 + 16 * 1024 * 8)
CUBLAS_DIAGNOSIS = ("cuBLAS workspace cached per stream (transformers' generate_batch runs each "
                    "call on a new CUDA stream; torch keeps a workspace per stream)")
CUBLAS_REMEDY = ("call torch._C._cuda_clearCublasWorkspaces() after each generate_batch, "
                 "or reuse one stream")


class SegmentGroup(NamedTuple):
    size_bytes: int
    stream: int
    count: int  # type: ignore[assignment]  # the field shadows tuple.count, as intended
    allocated_bytes: int


class BlockGroup(NamedTuple):
    size_bytes: int
    stream: int
    count: int  # type: ignore[assignment]  # the field shadows tuple.count, as intended
    phase: str | None
    stack: tuple[str, ...]


class Layout(NamedTuple):
    """One ``memory_layout`` event, typed."""

    ts_s: float
    device: int
    reserved_bytes: int
    allocated_bytes: int
    segments: tuple[SegmentGroup, ...]
    blocks: tuple[BlockGroup, ...]
    dropped_groups: int
    workspace_bytes: int | None

    def streams(self) -> frozenset[int]:
        return frozenset(g.stream for g in self.segments) | {b.stream for b in self.blocks}


class GrowthRow(NamedTuple):
    """New allocations of one kind and size (and, for blocks, phase and stack)."""

    kind: str  # "blocks" or "segments"
    size_bytes: int
    count: int  # type: ignore[assignment]  # how many more than at the earlier idle point
    bytes: int
    streams: int  # distinct streams the new ones are on
    new_streams: int  # of those, streams the earlier layout did not have
    phase: str | None = None
    stack: tuple[str, ...] = ()

    @property
    def one_per_new_stream(self) -> bool:
        return self.count == self.streams == self.new_streams


class Makeup(NamedTuple):
    device: int
    before_ts_s: float
    after_ts_s: float
    allocated_growth_bytes: int  # net, between the two idle points
    reserved_growth_bytes: int
    blocks: tuple[GrowthRow, ...]  # largest first, at most MAX_ROWS
    segments: tuple[GrowthRow, ...]
    new_bytes: int  # all new live blocks (the rows may leave small ones out)
    summary: str
    diagnosis: str | None
    remedy: str | None
    incomplete: bool  # a layout left groups out (MAX_GROUPS): the rows may miss some


# --- parsing ---------------------------------------------------------------------------------
def layout_from_event(e: Event) -> Layout:
    """The typed layout of a ``memory_layout`` event; ``ValueError`` says what is wrong where."""
    data = e.data or {}
    where = f"memory_layout event at ts {e.ts_s}"
    stacks = [tuple(str(f) for f in _list(s, f"{where}: stacks[]"))
              for s in _list(data.get("stacks", []), f"{where}: stacks")]
    segments = tuple(SegmentGroup(*(_count(v, f"{where}: segment_groups[{i}]") for v in row))
                     for i, row in enumerate(_rows(data, "segment_groups", 4, where)))
    blocks = tuple(_block(row, stacks, f"{where}: block_groups[{i}]")
                   for i, row in enumerate(_rows(data, "block_groups", 5, where)))
    workspace = data.get("cublas_workspace_bytes")
    return Layout(e.ts_s, e.device, _count(data.get("reserved_bytes", 0), f"{where}: reserved"),
                  _count(data.get("allocated_bytes", 0), f"{where}: allocated_bytes"),
                  segments, blocks, _count(data.get("dropped_groups", 0), where),
                  None if workspace is None else _count(workspace, f"{where}: workspace"))


def _block(row: list[Any], stacks: Sequence[tuple[str, ...]], where: str) -> BlockGroup:
    size, stream, count, phase, stack = row
    if phase is not None and not isinstance(phase, str):
        raise ValueError(f"{where}: phase must be a string or null, got {phase!r}")
    if stack is not None and not (isinstance(stack, int) and 0 <= stack < len(stacks)):
        raise ValueError(f"{where}: stack {stack!r} is not an index into stacks")
    return BlockGroup(_count(size, where), _count(stream, where), _count(count, where), phase,
                      () if stack is None else stacks[stack])


def _rows(data: Mapping[str, Any], key: str, width: int, where: str) -> list[list[Any]]:
    rows = _list(data.get(key, []), f"{where}: {key}")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != width:
            raise ValueError(f"{where}: {key}[{i}] must be a list of {width}, got {row!r}")
    return rows


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list, got {value!r}")
    return value


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: expected an integer >= 0, got {value!r}")
    return value


def layouts_of(events: Iterable[Event], device: int) -> tuple[list[Layout], list[str]]:
    """The device's layouts in time order, and what was wrong with the malformed ones."""
    layouts, problems = [], []
    for e in events:
        if e.name != LAYOUT_EVENT or e.device != device:
            continue
        try:
            layouts.append(layout_from_event(e))
        except (ValueError, TypeError) as exc:
            problems.append(str(exc))
    layouts.sort(key=lambda lay: lay.ts_s)
    return layouts, problems


# --- the diff --------------------------------------------------------------------------------
def pick_layouts(layouts: Sequence[Layout],
                 start_ts_s: float | None = None) -> tuple[Layout, Layout] | None:
    """(before, after): the last layout at or before ``start_ts_s`` (else the first), and the
    latest; None with fewer than two."""
    if len(layouts) < 2:
        return None
    before = layouts[0]
    if start_ts_s is not None:
        before = max((lay for lay in layouts[:-1] if lay.ts_s <= start_ts_s),
                     key=lambda lay: lay.ts_s, default=before)
    return before, layouts[-1]


def diff_layouts(before: Layout, after: Layout) -> Makeup:
    """What the later layout has that the earlier did not, grouped and named."""
    old_streams = before.streams()
    block_rows = _block_growth(before, after, old_streams)
    seg_rows = _segment_growth(before, after, old_streams)
    new_bytes = sum(r.bytes for r in block_rows)
    diagnosis = _diagnose(block_rows, new_bytes, after.workspace_bytes)
    makeup = Makeup(after.device, before.ts_s, after.ts_s,
                    after.allocated_bytes - before.allocated_bytes,
                    after.reserved_bytes - before.reserved_bytes,
                    tuple(block_rows[:MAX_ROWS]), tuple(seg_rows[:MAX_ROWS]), new_bytes, "",
                    CUBLAS_DIAGNOSIS if diagnosis else None, CUBLAS_REMEDY if diagnosis else None,
                    bool(before.dropped_groups or after.dropped_groups))
    return makeup._replace(summary=_summary(makeup))


def _block_growth(before: Layout, after: Layout, old_streams: frozenset[int]) -> list[GrowthRow]:
    old: dict[tuple[Any, ...], int] = {}
    for b in before.blocks:
        key = (b.size_bytes, b.stream, b.phase, b.stack)
        old[key] = old.get(key, 0) + b.count
    rows: dict[tuple[Any, ...], list[Any]] = {}  # (size, phase, stack) -> count, streams
    for b in after.blocks:
        new = b.count - old.pop((b.size_bytes, b.stream, b.phase, b.stack), 0)
        if new > 0:
            row = rows.setdefault((b.size_bytes, b.phase, b.stack), [0, set()])
            row[0] += new
            row[1].add(b.stream)
    return _sorted([GrowthRow("blocks", size, n, n * size, len(streams),
                              len(streams - old_streams), phase, stack)
                    for (size, phase, stack), (n, streams) in rows.items()])


def _segment_growth(before: Layout, after: Layout,
                    old_streams: frozenset[int]) -> list[GrowthRow]:
    old = {(g.size_bytes, g.stream): g.count for g in before.segments}
    rows: dict[int, list[Any]] = {}
    for g in after.segments:
        new = g.count - old.get((g.size_bytes, g.stream), 0)
        if new > 0:
            row = rows.setdefault(g.size_bytes, [0, set()])
            row[0] += new
            row[1].add(g.stream)
    return _sorted([GrowthRow("segments", size, n, n * size, len(streams),
                              len(streams - old_streams))
                    for size, (n, streams) in rows.items()])


def _sorted(rows: list[GrowthRow]) -> list[GrowthRow]:
    return sorted(rows, key=lambda r: (-r.bytes, -r.count, -r.size_bytes, r.phase or "", r.stack))


def _diagnose(rows: Sequence[GrowthRow], new_bytes: int, workspace: int | None) -> bool:
    """The cuBLAS-workspace-per-stream signature (module docstring)."""
    if not rows:
        return False
    top = rows[0]
    sizes = (workspace,) if workspace else DEFAULT_WORKSPACE_BYTES
    return (top.size_bytes in sizes and top.count >= 2 and top.one_per_new_stream
            and 2 * top.bytes >= new_bytes)


# --- text ------------------------------------------------------------------------------------
def size_text(n: int) -> str:
    """Bytes as the allocator's sizes read best: whole MiB when they are, else KiB or bytes."""
    if n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= MIB:
        return f"{n / MIB:.3f} MiB"
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} B"


def describe(row: GrowthRow) -> str:
    """``12 new segments of 32 MiB, one per new stream``."""
    what = f"{row.count} new {row.kind if row.count != 1 else row.kind[:-1]} of " \
           f"{size_text(row.size_bytes)}"
    if row.one_per_new_stream and row.count > 1:
        return what + ", one per new stream"
    if row.streams == 1:
        return what + (" on a new stream" if row.new_streams else " on one stream")
    return what + f" on {row.streams} streams ({row.new_streams} new)"


def _summary(m: Makeup) -> str:
    if not m.blocks and not m.segments:
        return (f"nothing new between the idle points at {iso_utc(m.before_ts_s)} and "
                f"{iso_utc(m.after_ts_s)} (allocated {m.allocated_growth_bytes / MIB:+.1f} MiB)")
    parts = [describe(r) for r in (m.blocks[:1] + m.segments[:1])]
    return (f"allocated {m.allocated_growth_bytes / MIB:+.1f} MiB, reserved "
            f"{m.reserved_growth_bytes / MIB:+.1f} MiB between the idle points at "
            f"{iso_utc(m.before_ts_s)} and {iso_utc(m.after_ts_s)}: " + "; ".join(parts))


def makeup_to_json(m: Makeup) -> dict[str, Any]:
    def row(r: GrowthRow) -> dict[str, Any]:
        return {"size_bytes": r.size_bytes, "count": r.count, "bytes": r.bytes,
                "streams": r.streams, "new_streams": r.new_streams, "phase": r.phase,
                "stack": list(r.stack), "description": describe(r)}

    return {"before_ts": m.before_ts_s, "after_ts": m.after_ts_s,
            "allocated_growth_bytes": m.allocated_growth_bytes,
            "reserved_growth_bytes": m.reserved_growth_bytes, "new_bytes": m.new_bytes,
            "blocks": [row(r) for r in m.blocks], "segments": [row(r) for r in m.segments],
            "summary": m.summary, "diagnosis": m.diagnosis, "remedy": m.remedy,
            "incomplete": m.incomplete}


def leak_makeup(events: Iterable[Event], device: int,
                start_ts_s: float | None = None) -> dict[str, Any] | None:
    """The make-up document of one device's recording (None without two layouts to diff)."""
    layouts, problems = layouts_of(events, device)
    pair = pick_layouts(layouts, start_ts_s)
    if pair is None:
        return None
    doc = makeup_to_json(diff_layouts(*pair))
    doc["layouts"] = len(layouts)
    doc["skipped"] = problems[:10]
    return doc
