"""The compact raw tier's codec: a block of raw sample (or event) rows as compressed columns,
standard library only, and no Python loop per value where C can do it.

A block holds one device's, source's and pid's rows of one interval, in (ts_s, id) order; each
column is encoded on its own (docs/agent.md, "Retention and rollups"): integers and ``ts_s``'s
bit patterns as int64 differences laid out byte plane by byte plane, so that small differences
are runs of zeros; text as a dictionary and codes; other floats as bit patterns; NULLs as a
presence byte a row (nothing for an all-NULL column).

Format (version 1): one version byte, then zlib of: a 4-byte little-endian length and a JSON
header (row count, the dictionaries, each column's mode), then each column's bytes, each
preceded by its 4-byte length. Version 2 is the same body compressed by raw LZMA2 (preset 9):
a third smaller on events and slower to decode, so event blocks use it and sample blocks, which
the dashboard decodes all day, stay on zlib. Another version is refused with a clear error.
Sample blocks' columns: :data:`COLUMNS` (:func:`encode`); event blocks name their own
(:func:`encode_table`).
"""

from __future__ import annotations

import lzma
import math
import re
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Sequence
from itertools import accumulate, compress
from typing import Any

import orjson
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS

FORMAT_VERSION = 1  # zlib
LZMA_VERSION = 2  # the same body, LZMA
_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9}]
# the columns a block holds, in this order: what a row of ``samples`` has besides the block's
# own key (device_id, source, pid)
INT_COLUMNS = ("id", *SAMPLE_COUNTER_FIELDS, "seq", "content_key")
COLUMNS = ("id", "ts_s", "phase", *SAMPLE_COUNTER_FIELDS, "origin", "seq", "content_key")
_LEN = struct.Struct("<I")
_INT64 = (-(1 << 63), (1 << 63) - 1)
# a column's mode in the header
ALL_NULL, DELTA, PLAIN, DICT_DELTA, NUMBERED = ("null", "delta", "plain", "dict-delta",
                                                "numbered")
# a text ending in a number written as Python writes it (no leading zero, no sign)
_NUMBERED = re.compile(r"(.*?)(0|[1-9][0-9]*)", re.DOTALL)


# a column's kind: how its values are laid out (the sample columns' by name, :func:`sample_kind`)
TIME, INT, FLOAT, TEXT = "time", "int", "float", "text"


def sample_kind(name: str) -> str:
    return TIME if name == "ts_s" else TEXT if name in ("phase", "origin") else INT


def encode(rows: Sequence[Sequence[Any]]) -> bytes:
    """Rows laid out as :data:`COLUMNS` (in the order they are to be read back) as a block."""
    if not rows:
        raise ValueError("block codec: no rows to encode")
    return encode_table([(name, sample_kind(name), [r[place] for r in rows])
                         for place, name in enumerate(COLUMNS)])


def encode_table(columns: Sequence[tuple[str, str, Sequence[Any]]],
                 version: int = FORMAT_VERSION) -> bytes:
    """Named columns, each ``(name, kind, values)``, as a block; read back in this order by
    :func:`decode_table`. The first column's length is the block's row count; a column of
    another length (values of only some rows, which its reader knows) says its own. What a
    sample block is, and an event block (:mod:`vramscope.agent.store.event_blocks`) with
    columns of its own."""
    n = len(columns[0][2]) if columns else 0
    if not n:
        raise ValueError("block codec: no rows to encode")
    header: dict[str, Any] = {"n": n, "modes": {}, "dicts": {}}
    parts: list[bytes] = []
    for name, kind, values in columns:
        col = list(values)
        if len(col) != n:
            header.setdefault("lens", {})[name] = len(col)
        if not col:
            header["modes"][name] = ALL_NULL
            parts.append(b"")
        elif kind == TIME:
            parts.append(_ints(array("q", array("d", col).tobytes()).tolist(), header, name))
        elif kind == FLOAT:
            parts.append(_floats(col, header, name))
        elif kind == TEXT:
            parts.append(_texts(col, header, name))
        else:
            parts.append(_nullable_ints(col, header, name))
    head = orjson.dumps(header)
    body = b"".join([_LEN.pack(len(head)), head,
                     *(b for p in parts for b in (_LEN.pack(len(p)), p))])
    if version == LZMA_VERSION:
        return bytes([LZMA_VERSION]) + lzma.compress(body, format=lzma.FORMAT_RAW,
                                                     filters=_LZMA_FILTERS)
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
    return list(decode_table(blob, sample_kind).values())


def decode_table(blob: bytes, kind_of: Callable[[str], str]) -> dict[str, Sequence[Any]]:
    """The columns of an :func:`encode_table` block by name, in the order written; each
    name's kind as ``kind_of`` says (the kinds a writer chose are the names' to tell)."""
    if not blob or blob[0] not in (FORMAT_VERSION, LZMA_VERSION):
        found = blob[0] if blob else "nothing"
        raise ValueError(f"block: format {found}, expected {FORMAT_VERSION} or "
                         f"{LZMA_VERSION}")
    body = (zlib.decompress(blob[1:]) if blob[0] == FORMAT_VERSION else
            lzma.decompress(blob[1:], format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS))
    (size,) = _LEN.unpack_from(body, 0)
    header = orjson.loads(body[4:4 + size])
    lens = header.get("lens", {})
    pos = 4 + size
    columns: dict[str, Sequence[Any]] = {}
    for name, mode in header["modes"].items():
        (size,) = _LEN.unpack_from(body, pos)
        part = body[pos + 4:pos + 4 + size]
        pos += 4 + size
        n: int = lens.get(name, header["n"])
        kind = kind_of(name)
        if kind == TIME:
            columns[name] = array("d", _decode_ints(part, n, mode).tobytes())
        elif kind == FLOAT:
            values = _decode_nullable(part, n, mode)
            scale = header.get("scales", {}).get(name)
            columns[name] = (_bits_as_floats(values) if scale is None else tuple(
                [None if v is None else v / 10**scale for v in values]))
        elif kind == TEXT:
            columns[name] = _decode_texts(part, n, mode, header["dicts"][name])
        else:
            columns[name] = _decode_nullable(part, n, mode)
    return columns


def _floats(col: list[Any], header: dict[str, Any], name: str) -> bytes:
    """Floats (or None): where every one is a decimal of at most 9 places (a duration of
    microseconds), the integers of that many places; else their float64 bit patterns. Both
    give each value back bit for bit."""
    present = [v for v in col if v is not None]
    if all(math.isfinite(v) and (v != 0 or math.copysign(1.0, v) > 0) and abs(v) < 1e6
           for v in present):
        for scale in range(10):
            unit = 10**scale
            scaled = [round(v * unit) for v in present]
            if all(m / unit == v for m, v in zip(scaled, present)):
                header.setdefault("scales", {})[name] = scale
                at = iter(scaled)
                return _nullable_ints([None if v is None else next(at) for v in col],
                                      header, name)
    return _nullable_ints(_float_bits(col), header, name)


def _float_bits(col: list[Any]) -> list[Any]:
    """Floats (or None) as their float64 bit patterns: exact, and delta-encodable."""
    present = [v for v in col if v is not None]
    bits = iter(array("q", array("d", present).tobytes()))
    return [None if v is None else next(bits) for v in col]


def _bits_as_floats(values: Sequence[Any]) -> Sequence[Any]:
    if isinstance(values, array):
        return array("d", values.tobytes())
    present = array("q", [v for v in values if v is not None])
    floats = iter(array("d", present.tobytes()))
    return tuple([None if v is None else next(floats) for v in values])


def _texts(col: list[Any], header: dict[str, Any], name: str) -> bytes:
    """A dictionary of the column's distinct values (None among them) and a code a row: a
    byte each for at most 256 values. Past that, where every value is a text ending in a
    number (``r1041``, a request id), a dictionary of the texts before the numbers, a byte a
    row, and the numbers as integers; else the codes as integers (delta-encoded)."""
    words = list(dict.fromkeys(col))
    if len(words) > 256:
        split = [None if w is None else _NUMBERED.fullmatch(w) for w in col]
        if all(m is not None or w is None for m, w in zip(split, col)):
            stems = list(dict.fromkeys(None if m is None else m[1] for m in split))
            if len(stems) <= 256:
                code = {w: i for i, w in enumerate(stems)}
                header["dicts"][name] = stems
                numbers = [0 if m is None else int(m[2]) for m in split]
                if max(numbers) <= _INT64[1]:
                    header["modes"][name] = NUMBERED
                    stem_codes = bytes([code[None if m is None else m[1]] for m in split])
                    return stem_codes + _planes(array("q", [numbers[0], *(
                        b - a for a, b in zip(numbers, numbers[1:]))]))
    code = {w: i for i, w in enumerate(words)}
    header["dicts"][name] = words
    if len(words) <= 256:
        header["modes"][name] = "dict"
        return array("B", [code[v] for v in col]).tobytes()
    codes = [code[v] for v in col]
    header["modes"][name] = DICT_DELTA
    return _planes(array("q", [codes[0], *(b - a for a, b in zip(codes, codes[1:]))]))


def _decode_texts(part: bytes, n: int, mode: str, words: list[Any]) -> tuple[Any, ...]:
    if mode == NUMBERED:
        numbers = _decode_ints(part[n:], n, DELTA)
        return tuple([None if words[c] is None else f"{words[c]}{v}"
                      for c, v in zip(part[:n], numbers)])
    if mode == DICT_DELTA:
        codes: Sequence[int] = _decode_ints(part, n, DELTA)
    else:
        codes = array("B" if len(words) <= 256 else "I", part)
    return tuple([words[c] for c in codes])


def _nullable_ints(col: list[Any], header: dict[str, Any], name: str) -> bytes:
    present = [v is not None for v in col]
    if not any(present):
        header["modes"][name] = ALL_NULL
        return b""
    if all(present):
        return b"\x01" + _ints(col, header, name)
    return b"\x00" + bytes(present) + _ints(list(compress(col, present)), header, name)


def _ints(values: list[int], header: dict[str, Any], name: str) -> bytes:
    """Differences, or the values themselves where those are smaller (values that jump
    about, such as an event's token counts, whose differences change sign) or a difference
    would leave int64."""
    deltas = [values[0], *(b - a for a, b in zip(values, values[1:]))]
    smaller = max(map(abs, values)) < max(map(abs, deltas[1:]), default=0)
    if not smaller and min(deltas) >= _INT64[0] and max(deltas) <= _INT64[1]:
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
