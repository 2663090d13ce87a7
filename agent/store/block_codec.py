"""The compact raw tier's codec: a block of raw sample rows as compressed columns, standard
library only (``array``, ``zlib``, ``struct``) and no Python loop per value where C can do it.

A block holds the rows of one device, source and pid over one interval
(:mod:`vramscope.agent.store.sample_blocks`), in (ts_s, id) order. Each column is encoded on its
own, so that values that move little from one row to the next compress to almost nothing:

- integers (``id``, the counters of :data:`SAMPLE_COUNTER_FIELDS`, ``seq``, ``content_key``):
  int64 differences from the previous row (the first value absolute), or the values themselves
  where a difference would leave int64 (``content_key``'s digests); the 8 bytes of every value
  laid out byte plane by byte plane (all first bytes, then all second bytes, ...), so that the
  planes of small differences are runs of zeros that zlib removes;
- ``ts_s``: the float64's bit pattern as an integer, delta-encoded the same way (times of one
  block share their exponent, so consecutive patterns differ by a small integer, and the value
  comes back bit for bit);
- text (``phase``, ``origin``): a dictionary of the block's distinct values and one code a row;
- NULL: a column that is all NULL stores nothing; one that is partly NULL stores a presence
  byte a row and only the present values.

Format (version 1): one version byte, then zlib of: a 4-byte little-endian length and a JSON
header (row count, the dictionaries, each column's mode), then each column's bytes, each
preceded by its 4-byte length. A reader refuses another version with a clear error.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from itertools import accumulate, compress
from typing import Any

import orjson
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS

FORMAT_VERSION = 1
# the columns a block holds, in this order: what a row of ``samples`` has besides the block's
# own key (device_id, source, pid)
INT_COLUMNS = ("id", *SAMPLE_COUNTER_FIELDS, "seq", "content_key")
COLUMNS = ("id", "ts_s", "phase", *SAMPLE_COUNTER_FIELDS, "origin", "seq", "content_key")
_LEN = struct.Struct("<I")
_INT64 = (-(1 << 63), (1 << 63) - 1)
# a column's mode in the header
ALL_NULL, DELTA, PLAIN = "null", "delta", "plain"


def encode(rows: Sequence[Sequence[Any]]) -> bytes:
    """Rows laid out as :data:`COLUMNS` (in the order they are to be read back) as a block."""
    if not rows:
        raise ValueError("block codec: no rows to encode")
    n = len(rows)
    header: dict[str, Any] = {"n": n, "modes": {}, "dicts": {}}
    parts: list[bytes] = []
    for place, name in enumerate(COLUMNS):
        col = [r[place] for r in rows]
        if name == "ts_s":
            parts.append(_ints(array("q", array("d", col).tobytes()).tolist(), header, name))
        elif name in ("phase", "origin"):
            parts.append(_texts(col, header, name))
        else:
            parts.append(_nullable_ints(col, header, name))
    head = orjson.dumps(header)
    body = b"".join([_LEN.pack(len(head)), head,
                     *(b for p in parts for b in (_LEN.pack(len(p)), p))])
    return bytes([FORMAT_VERSION]) + zlib.compress(body, 6)


def decode(blob: bytes) -> list[tuple[Any, ...]]:
    """The rows of an :func:`encode` block, laid out as :data:`COLUMNS`."""
    return list(zip(*decode_columns(blob), strict=True))


def decode_columns(blob: bytes) -> list[Sequence[Any]]:
    """The columns of an :func:`encode` block, in :data:`COLUMNS` order: ``ts_s`` an
    ``array('d')``, an integer column without NULLs an ``array('q')`` (8 bytes a value, not a
    Python int's 32 and a list's pointer: what a cache of decoded blocks holds), the others
    tuples (which the garbage collector stops walking once it sees they hold no containers,
    as it would walk a cached list's every value at each full collection)."""
    if not blob or blob[0] != FORMAT_VERSION:
        found = blob[0] if blob else "nothing"
        raise ValueError(f"sample block: format {found}, expected {FORMAT_VERSION}")
    body = zlib.decompress(blob[1:])
    (size,) = _LEN.unpack_from(body, 0)
    header = orjson.loads(body[4:4 + size])
    n: int = header["n"]
    pos = 4 + size
    columns: list[Sequence[Any]] = []
    for name in COLUMNS:
        (size,) = _LEN.unpack_from(body, pos)
        part = body[pos + 4:pos + 4 + size]
        pos += 4 + size
        mode = header["modes"][name]
        if name == "ts_s":
            columns.append(array("d", _decode_ints(part, n, mode).tobytes()))
        elif name in ("phase", "origin"):
            words = header["dicts"][name]
            columns.append(tuple([words[c] for c in array("B" if len(words) <= 256 else "I",
                                                          part)]))
        else:
            columns.append(_decode_nullable(part, n, mode))
    return columns


def _texts(col: list[Any], header: dict[str, Any], name: str) -> bytes:
    words = list(dict.fromkeys(col))
    code = {w: i for i, w in enumerate(words)}
    header["dicts"][name] = words
    header["modes"][name] = "dict"
    return array("B" if len(words) <= 256 else "I", [code[v] for v in col]).tobytes()


def _nullable_ints(col: list[Any], header: dict[str, Any], name: str) -> bytes:
    present = [v is not None for v in col]
    if not any(present):
        header["modes"][name] = ALL_NULL
        return b""
    if all(present):
        return b"\x01" + _ints(col, header, name)
    return b"\x00" + bytes(present) + _ints(list(compress(col, present)), header, name)


def _ints(values: list[int], header: dict[str, Any], name: str) -> bytes:
    deltas = [values[0], *(b - a for a, b in zip(values, values[1:]))]
    if min(deltas) >= _INT64[0] and max(deltas) <= _INT64[1]:
        header["modes"][name] = DELTA
        return _planes(array("q", deltas))
    header["modes"][name] = PLAIN
    return _planes(array("q", values))


def _planes(values: array[int]) -> bytes:
    """int64s as byte planes: every value's first byte, then every second byte, ..."""
    if sys.byteorder == "big":
        values.byteswap()
    raw = values.tobytes()
    return b"".join(raw[i::8] for i in range(8))


def _decode_ints(part: bytes, n: int, mode: str) -> array[int]:
    raw = bytearray(8 * n)
    for i in range(8):
        raw[i::8] = part[i * n:(i + 1) * n]
    values = array("q")
    values.frombytes(bytes(raw))
    if sys.byteorder == "big":
        values.byteswap()
    return array("q", accumulate(values)) if mode == DELTA else values


def _decode_nullable(part: bytes, n: int, mode: str) -> Sequence[Any]:
    if mode == ALL_NULL:
        return (None,) * n
    if part[0] == 1:
        return _decode_ints(part[1:], n, mode)
    present = part[1:1 + n]
    values = iter(_decode_ints(part[1 + n:], sum(present), mode))
    return tuple([next(values) if p else None for p in present])
