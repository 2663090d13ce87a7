"""The compact raw tier's events: closed intervals of frequent events moved from ``events`` into
blocks, as :mod:`~vramscope.agent.store.sample_blocks` does for the samples.

What moves, the columns of a block and which reads merge them: docs/agent.md, "Retention and
rollups". As for the samples, the rows moved are the ones the ``DELETE ... RETURNING``
removed (nothing is lost to a concurrent write) and each interval is a transaction of its own.
A row whose data the columns would not give back as the very text stored (a key past
``MAX_DATA_KEYS``, a value of another type, text written by another tool) keeps that text whole
in the ``data`` column.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, exists, func, insert, select
from vramscope.agent.event_kinds import CHEAP_EVENTS, KEPT_EVENTS
from vramscope.agent.store import block_codec
from vramscope.agent.store.read_once import once
from vramscope.agent.store.sample_blocks import BLOCK_S, block_start, decoded_cache, overlapping
from vramscope.agent.store.schema import devices, event_blocks, events

if TYPE_CHECKING:
    from vramscope.agent.store.store import Store

# an ``events`` row as the readers get it, from the table or from a block
ROW = ("id", "device_id", "ts_s", "name", "pid", "phase", "request_id", "data")
_FIXED = {"id": block_codec.INT, "ts_s": block_codec.TIME, "name": block_codec.TEXT,
          "phase": block_codec.TEXT, "request_id": block_codec.TEXT,
          "origin": block_codec.TEXT, "seq": block_codec.INT,
          "content_key": block_codec.INT, "data": block_codec.TEXT}
# a data key's column: its kind in the name's prefix
_KEY_KINDS = {"data.i.": block_codec.INT, "data.f.": block_codec.FLOAT,
              "data.j.": block_codec.TEXT}
MAX_DATA_KEYS = 32  # columns a block gives its data's keys (a client's own keys are many)
_INT64 = (-(1 << 63), (1 << 63) - 1)
# what compaction reads back from the DELETE: the block's key (device_id, pid) and the rest
_MOVED = ("device_id", "pid", "id", "ts_s", "name", "phase", "request_id", "origin", "seq",
          "content_key", "data")


def compactable(names: Sequence[str] | None) -> bool:
    """Whether a read of ``names`` (every name: None) may find events in blocks."""
    return names is None or any(n not in KEPT_EVENTS for n in names)


def _kind(name: str) -> str:
    found = _FIXED.get(name) or (block_codec.TEXT if name == "data.shape" else None)
    if found is not None:
        return found
    return _KEY_KINDS[name[:7]]


# --- the codec ---------------------------------------------------------------------------------
# the columns kept in the rows' order; the others are laid out by name (each name's rows
# together, in their order: a request's id is then the one before it plus one, a phase
# change's data beside the last one's), which the name column undoes
_IN_ORDER = ("id", "ts_s", "name")


def encode(rows: Sequence[Sequence[Any]]) -> bytes:
    """Rows laid out as ``_MOVED[2:]`` (id, ts_s, name, phase, request_id, origin, seq,
    content_key, data text), in (ts_s, id) order, as a block."""
    cols = list(zip(*rows))
    by_name = _by_name(cols[2])
    columns = [(name, _FIXED[name], values if name in _IN_ORDER else [values[i] for i in by_name])
               for name, values in zip(_MOVED[2:-1], cols)]
    keyed, whole = _split_data([cols[-1][i] for i in by_name])
    return block_codec.encode_table([*columns, ("data", block_codec.TEXT, whole), *keyed],
                                    block_codec.LZMA_VERSION)


def _by_name(names: Sequence[str]) -> list[int]:
    """The rows' places laid out by name: each name's rows together, in their order."""
    return sorted(range(len(names)), key=names.__getitem__)


def _split_data(texts: Sequence[str | None]) -> tuple[list[tuple[str, str, list[Any]]],
                                                       list[str | None]]:
    """The data texts as columns: each row's shape (its keys, as a JSON list; None where it
    has no data or the columns would not give its text back) and a column per key holding
    the values of the rows whose shape has it; and the texts the columns do not give back
    exactly (None where they do)."""
    parsed: list[dict[str, Any] | None] = []
    for text in texts:
        try:
            value = None if text is None else json.loads(text)
        except ValueError:
            value = None
        parsed.append(value if isinstance(value, dict) and value else None)
    common = Counter(k for d in parsed if d is not None for k in d)
    keys = sorted(k for k, _ in common.most_common(MAX_DATA_KEYS))
    kinds = {k: _value_kind([d[k] for d in parsed if d is not None and k in d]) for k in keys}
    columns: dict[str, list[Any]] = {k: [] for k in keys}
    shapes: list[str | None] = []
    whole: list[str | None] = []
    for text, d in zip(texts, parsed):
        exact = (d is not None and all(k in kinds for k in d)
                 and json.dumps(d, sort_keys=True) == text)
        whole.append(None if exact else text)
        if not exact or d is None:
            shapes.append(None)
            continue
        shape = sorted(d)
        shapes.append(json.dumps(shape))
        for k in shape:
            columns[k].append(json.dumps(d[k], sort_keys=True) if kinds[k] == "j" else d[k])
    return [("data.shape", block_codec.TEXT, shapes),
            *((f"data.{kinds[k]}.{k}", _KEY_KINDS[f"data.{kinds[k]}."], columns[k])
              for k in keys)], whole


def _value_kind(values: list[Any]) -> str:
    """``i`` where every value is an integer of int64 (not a bool), ``f`` where every one is
    a float, else ``j`` (kept as JSON text)."""
    if all(type(v) is int and _INT64[0] <= v <= _INT64[1] for v in values):
        return "i"
    if all(type(v) is float for v in values):
        return "f"
    return "j"


def decode(blob: bytes) -> dict[str, Sequence[Any]]:
    """A block's columns by name, its data as the text stored (``data``): a tuple each but
    ``id`` and ``ts_s`` (arrays)."""
    cols = block_codec.decode_table(blob, _kind)
    values = {name[7:]: (name[5] == "j", iter(v)) for name, v in cols.items()
              if name.startswith("data.") and name != "data.shape"}
    shapes: dict[str, list[str]] = {}
    texts = []
    for text, shape in zip(cols["data"], cols.get("data.shape", ())):
        if text is None and shape is not None:
            keys = shapes.get(shape)
            if keys is None:
                keys = shapes[shape] = json.loads(shape)
            d = {}
            for k in keys:
                as_json, found = values[k]
                d[k] = json.loads(next(found)) if as_json else next(found)
            text = json.dumps(d, sort_keys=True)
        texts.append(text)
    out = {name: cols[name] for name in _FIXED if name != "data"}
    out["data"] = tuple(texts)
    by_name = _by_name(cols["name"])
    for name in [*(n for n in _FIXED if n not in _IN_ORDER)]:
        in_order: list[Any] = [None] * len(by_name)
        for value, place in zip(out[name], by_name):
            in_order[place] = value
        out[name] = tuple(in_order)
    return out


# --- reads -------------------------------------------------------------------------------------
def any_in_window(c: Connection, lo_s: float | None, hi_s: float | None) -> bool:
    """Whether any device's blocks overlap [lo_s, hi_s] (:func:`any_blocks` of every device):
    what each of a timeline's event reads asks first, within ``read_once.reading`` asked
    once (a window with no block, the newest minutes, then reads ``events`` alone)."""
    return once(("event_blocks.any_in_window", c.engine, lo_s, hi_s),
                lambda: any_blocks(c, None, lo_s, hi_s))


def any_blocks(c: Connection, device_ids: Sequence[int] | None, lo_s: float | None,
               hi_s: float | None) -> bool:
    q = (select(event_blocks.c.id)
         .where(*overlapping(device_ids, lo_s, hi_s, event_blocks)).limit(1))
    return c.execute(q).first() is not None


def blocks_overlap(c: Connection, device_ids: Sequence[int], lo_s: float,
                   hi_s: float) -> tuple[bool, bool]:
    """Whether the compact raw tier holds samples, and whether it holds events, of
    ``device_ids`` in [lo_s, hi_s]: one statement (a rollup asks it of every window)."""
    found = c.execute(select(
        exists().where(*overlapping(device_ids, lo_s, hi_s)),
        exists().where(*overlapping(device_ids, lo_s, hi_s, event_blocks)))).one()
    return bool(found[0]), bool(found[1])


def window_rows(c: Connection, device_ids: Sequence[int] | None, lo_s: float | None,
                hi_s: float | None, names: Sequence[str] | None = None,
                limit: int | None = None) -> list[tuple[Any, ...]]:
    """The blocks' events of ``device_ids`` (every device: None) in [lo_s, hi_s] (None: open)
    named one of ``names`` (every name: None), as :data:`ROW` tuples in (ts_s, id) order, at
    most ``limit``."""
    q = (select(event_blocks.c.id, event_blocks.c.device_id, event_blocks.c.pid,
                event_blocks.c.count, event_blocks.c.first_s, event_blocks.c.last_s)
         .where(*overlapping(device_ids, lo_s, hi_s, event_blocks))
         .order_by(event_blocks.c.first_s))
    lo = -math.inf if lo_s is None else lo_s
    hi = math.inf if hi_s is None else hi_s
    wanted = None if names is None else set(names)
    out: list[tuple[Any, ...]] = []
    for meta in c.execute(q).all():
        cols = _decoded(c, meta)
        times = cols["ts_s"]
        a, b = bisect_left(times, lo), bisect_right(times, hi)
        did, pid = meta[1], meta[2]
        ids, found_names = cols["id"], cols["name"]
        phase, request, data = cols["phase"], cols["request_id"], cols["data"]
        kept = 0
        for i in range(a, b):
            if wanted is not None and found_names[i] not in wanted:
                continue
            out.append((ids[i], did, times[i], found_names[i], pid, phase[i], request[i],
                        data[i]))
            kept += 1
            if limit is not None and kept >= limit:
                break
    out.sort(key=itemgetter(2, 0))
    return out if limit is None else out[:limit]


def _decoded(c: Connection, meta: Sequence[Any]) -> dict[str, Sequence[Any]]:
    """A block's decoded columns (``meta``: id, device, pid, count, first_s, last_s), through
    the cache of decoded blocks."""
    cache = decoded_cache(c, "event_blocks")
    key = (meta[0], meta[3], meta[4], meta[5])
    found: dict[str, Sequence[Any]] | None = cache.get(key)
    if found is None:
        blob = c.execute(select(event_blocks.c.data)
                         .where(event_blocks.c.id == meta[0])).scalar_one()
        found = decode(bytes(blob))
        cache.put(key, found)
    return found


def count_in(c: Connection, device_ids: Sequence[int], lo_s: float, hi_s: float,
             names: Sequence[str]) -> int:
    """The blocks' events of ``device_ids`` named one of ``names`` in [lo_s, hi_s]."""
    return len(window_rows(c, device_ids, lo_s, hi_s, names))


def span(c: Connection, device_ids: Sequence[int]) -> tuple[float, float] | None:
    """The first and newest event time the blocks of ``device_ids`` hold, or None."""
    lo, hi = c.execute(select(func.min(event_blocks.c.first_s), func.max(event_blocks.c.last_s))
                       .where(event_blocks.c.device_id.in_(list(device_ids)))).one()
    return None if lo is None else (float(lo), float(hi))


def stored_keys(c: Connection, times: Sequence[float], keys: Iterable[int]) -> set[int]:
    """Which of ``keys`` (content keys of events timed ``times``) the keyed blocks hold with
    their times: what import's duplicate check adds to the keys it finds in ``events``."""
    if not times:
        return set()
    q = (select(event_blocks.c.data)
         .where(*overlapping(None, min(times), max(times), event_blocks),
                event_blocks.c.keyed > 0))
    wanted = set(zip(times, keys))
    found: set[int] = set()
    for (data,) in c.execute(q).all():
        cols = decode(bytes(data))
        found.update(k for t, k in zip(cols["ts_s"], cols["content_key"])
                     if k is not None and (t, k) in wanted)
    return found


# --- compaction --------------------------------------------------------------------------------
def due_sets(store: Store, closed_by_s: float, limit: int,
             rows_before_s: float | None = None,
             ids: Sequence[int] | None = None) -> list[tuple[float, int]]:
    """At most ``limit`` (interval start, device id) whose interval ends by ``closed_by_s``
    (and by ``rows_before_s``, when given: the events of an interval move together, once all
    its minutes are counted, not a block each time a step counts more) and still has
    frequent events in ``events``, oldest first: each device's oldest event of each listed
    cheap name (a seek of the ``(device_id, name, ts_s)`` index each; names no table lists
    cannot be sought, and move with the listed ones of their interval)."""
    before = closed_by_s if rows_before_s is None else min(closed_by_s, rows_before_s)
    firsts = [select(events.c.ts_s).where(events.c.device_id == devices.c.id,
                                          events.c.name == name, events.c.ts_s < before)
              .order_by(events.c.ts_s).limit(1).scalar_subquery() for name in CHEAP_EVENTS]
    q = select(devices.c.id, *firsts)
    if ids is not None:  # of these devices only (one host's, in a fleet)
        q = q.where(devices.c.id.in_(ids))
    with store.engine.connect() as c:
        found = c.execute(q).all()
    due = []
    for did, *times in found:
        present = [float(t) for t in times if t is not None]
        if present and block_start(min(present)) + BLOCK_S <= before:
            due.append((block_start(min(present)), int(did)))
    return sorted(due)[:limit]


def compact_interval(store: Store, device_id: int, start_s: float,
                     rows_before_s: float | None = None) -> int:
    """One device's interval [start_s, start_s + BLOCK_S) (its events before
    ``rows_before_s`` when given): its frequent events deleted from ``events`` and written as
    blocks, one per pid, in one transaction; events moved."""
    end = start_s + BLOCK_S if rows_before_s is None else min(start_s + BLOCK_S, rows_before_s)
    with store.engine.begin() as c:
        rows = c.execute(delete(events)
                         .where(events.c.device_id == device_id, events.c.ts_s >= start_s,
                                events.c.ts_s < end, events.c.name.not_in(KEPT_EVENTS))
                         .returning(*(events.c[n] for n in _MOVED))).all()
        blocks = pack_blocks(start_s, [tuple(r) for r in rows])
        if blocks:
            c.execute(insert(event_blocks), blocks)
    return len(rows)


def pack_blocks(start_s: float, rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """``event_blocks`` rows of events laid out as ``_MOVED`` (any order, one interval)."""
    def group(r: tuple[Any, ...]) -> tuple[Any, ...]:
        return (r[0], r[1] is None, r[1] if r[1] is not None else -1)

    out = []
    for _, members in groupby(sorted(rows, key=lambda r: (*group(r), r[3], r[2])), key=group):
        block = list(members)
        out.append({"device_id": block[0][0], "block_s": start_s, "pid": block[0][1],
                    "first_s": block[0][3], "last_s": block[-1][3], "count": len(block),
                    "keyed": sum(1 for r in block if r[9] is not None),
                    "data": encode([r[2:] for r in block])})
    return out

