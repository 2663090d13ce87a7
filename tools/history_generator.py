"""A seeded, realistic store of days of history as the default storage tiers leave it: the
fixture that makes benchmarks and tests start old (design rule 8: a week of history must cost
what a minute costs).

``generate(store, devices=8, hz=10, days=7)`` writes what an agent watching 8 busy GPUs for a
week at 10 Hz would have left with the default retention (``vramscope.agent.retention``):

- raw torch samples, and their ``request_start`` / ``request_end`` events, for the newest
  ``raw_days`` (one day: 6.9 M samples): request cycles of prefill, decode and idle, the
  allocator, device and KV counters moving with them, one device leaking 1 MiB a minute.
  ``raw_days=None`` (or ``>= days``) keeps them for the whole span, as a longer
  ``retention.raw_s`` would (48.4 M samples for the week);
- the per-second tier (``seconds`` rows, :mod:`vramscope.agent.store.seconds`) and the
  per-minute rollups of the whole span, raw or not: 4.8 M seconds in 80,640 packed rows and
  1.05 M rollup rows for the week.

Values are closed-form functions of (tick, device, seed) in integer arithmetic, written once
(:func:`_cycle`, :func:`_phase`, :func:`_counters`) over an operand that is either an SQL
expression or a torch tensor of ticks. The raw rows are ``INSERT ... SELECT`` from a recursive
CTE that counts the ticks: nothing goes through Python per row, on SQLite and PostgreSQL alike.
The tiers are reduced from CPU tensors of the same ticks (torch, the ``torch`` extra, imported
only then), a day of one device at a time, and packed by
:func:`~vramscope.agent.store.seconds.pack`: no raw row is written or read for them, so the
days without raw rows cost none, and where raw rows exist the tiers are exactly what
``maintenance.rollup_window`` makes of them (tests/agent/test_history_generator.py).

Its cost is the raw day's rows and the tiers' packing (``seconds.pack`` in Python), per device
and day; the size of what it makes, per tier, is ``vramscope bench dashboard``'s
(docs/BENCHMARKS.md, `dashboard`). A test's 2 devices at 1 Hz for an hour are small enough to
make in each test that needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Any

from sqlalchemy import insert, text
from vramscope.agent.durations import DAY_S, MINUTE_S
from vramscope.agent.records import SAMPLE_COUNTER_FIELDS, Phase
from vramscope.agent.store import partitions
from vramscope.agent.store import seconds as tier
from vramscope.agent.store.maintenance import refresh_ten_minutes
from vramscope.agent.store.schema import event_counts, rollups, seconds

if TYPE_CHECKING:
    from vramscope.agent.store.store import Store

T_END = 1_700_604_780.0  # the default end (a minute boundary); the newest sample is 1 tick before
GIB = 2**30
MIB = 2**20
CYCLE = 37  # ticks per request cycle: 3 prefill, 24 decode, 10 idle
LEAKING_DEVICE = 3  # its idle floor rises 1 MiB a minute
SOURCE = "torch"
CHUNK_MINUTES = 1440  # the tiers are reduced a day of one device at a time (864k ticks at 10 Hz)
_CYCLE_PHASES = (Phase.PREFILL, Phase.DECODE, Phase.IDLE)

Where = Callable[[Any, Any, Any], Any]  # (condition, then, else) of SQL or of tensors


@dataclass(frozen=True)
class History:
    devices: int = 8
    hz: float = 10.0
    days: float = 7.0
    end_s: float = T_END
    seed: int = 1
    events: bool = True
    rollups: bool = True  # write the tiers retention makes: per-second rows and minute rollups
    verdicts: bool = True  # write the verdicts an agent's alert engine would have stored
    raw_days: float | None = 1.0  # raw samples and request events: the newest days (None: all)
    # the compact raw tier (agent/store/sample_blocks.py): raw samples whose ten-minute
    # interval ended this long before the end moved into blocks, as retention's
    # ``retention.compact_after_s`` would have (None: all left as rows of ``samples``)
    compact_after_s: float | None = None

    def __post_init__(self) -> None:
        if (self.devices < 1 or self.hz <= 0 or self.days <= 0
                or (self.raw_days is not None and self.raw_days < 0)):
            raise ValueError(f"bad history: devices={self.devices}, hz={self.hz}, "
                             f"days={self.days}, raw_days={self.raw_days}")
        if not self.rollups and self.raw_start_s > self.start_s:
            raise ValueError(f"history without rollups and raw_days={self.raw_days} < "
                             f"days={self.days}: nothing would hold the older days")

    @property
    def ticks(self) -> int:
        return int(self.days * DAY_S * self.hz)

    @property
    def start_s(self) -> float:
        return self.end_s - self.ticks / self.hz

    def ts(self, n: int) -> float:
        """Tick ``n``'s time, by the same floating-point operations as the SQL's and the
        tensors' (see :func:`_ts_sql`)."""
        return self.start_s + float(n) / float(self.hz)

    @property
    def raw_start_s(self) -> float:
        """Where raw rows begin: ``raw_days`` before the end, down to a whole minute (retention
        cuts anywhere; a whole minute keeps every tier minute either all raw or all not)."""
        if self.raw_days is None or self.raw_days >= self.days:
            return self.start_s
        return max(self.start_s, _floor_minute(self.end_s - self.raw_days * DAY_S))

    def tick_at(self, t_s: float) -> int:
        """The first tick at or after ``t_s`` (``ticks`` when none is)."""
        n = max(0, min(self.ticks, int((t_s - self.start_s) * self.hz) - 1))
        while n < self.ticks and self.ts(n) < t_s:
            n += 1
        return n


def generate(store: Store, history: History | None = None, **kwargs: Any) -> History:
    """Write ``history`` (or ``History(**kwargs)``) into ``store``; returns what was written."""
    h = history or History(**kwargs)
    ids = [store.device_id(d) for d in range(h.devices)]
    host_id = store.host_id()
    first = h.tick_at(h.raw_start_s)
    # PostgreSQL: the day partitions the agent's retention would have made for these days
    partitions.ensure_days(store, h.raw_start_s, h.end_s)
    with store.engine.begin() as c:
        if first < h.ticks:
            c.execute(text(_samples_sql(h, ids, first)))
            if h.events:
                c.execute(text(_events_sql(h, ids, first)))
        c.execute(text("UPDATE hosts SET first_seen_s = :a, last_seen_s = :b WHERE id = :h"),
                  {"a": h.start_s, "b": h.end_s, "h": host_id})
    if h.rollups:
        write_tiers(store, h, ids)
    if h.verdicts:
        write_verdicts(store, h)
    if h.compact_after_s is not None:
        from vramscope.agent.store import sample_blocks

        sample_blocks.compact(store, h.end_s - h.compact_after_s, 1 << 30)
    if store.dialect == "sqlite":
        # the raw rows went in as one transaction, so SQLite's WAL grew to their size (0.9 GB
        # for the week) and keeps that file size until truncated; the agent's small batches
        # never grow it so. Leave the store as an agent's would be on disk (size_bytes counts
        # the WAL)
        with store.engine.connect() as c:
            c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    return h


VERDICT_EVERY_S = 300.0  # the engine's heartbeat (agent/alerts/verdicts.py HEARTBEAT_S)


def write_verdicts(store: Store, h: History) -> int:
    """The verdicts an agent would have stored over the history: one row a heartbeat per
    device's process (pid 1000 + device), the leaking device's a leak of 1 MiB a minute once
    the default warm-up and minimum span of floor are in, the others no leak; risk ok. The
    pages read these."""
    from vramscope.agent.alerts.verdicts import Verdict
    from vramscope.agent.analysis.thresholds import Thresholds
    from vramscope.agent.store import verdicts

    rows = []
    t = Thresholds()
    warm = h.start_s + t.leak_warmup_s + t.leak_min_span_s
    for k in range(int((h.end_s - h.start_s) // VERDICT_EVERY_S) + 1):
        ts = h.start_s + k * VERDICT_EVERY_S
        for d in range(h.devices):
            leaking = d == LEAKING_DEVICE and ts >= warm
            state = "insufficient_data" if ts < warm else "leak" if leaking else "no_leak"
            rows.append(Verdict(ts, d, None, 1000 + d, state, MIB / 60.0 if leaking else 0.0,
                                h.start_s if leaking else None, warm if leaking else None,
                                min(ts - h.start_s, 7200.0), "generated history", "ok", None,
                                (), 100 * GIB, None, None, None, None, None))
    return verdicts.write(store, rows)


# -- the closed forms, once for SQL and tensors --------------------------------------------


def _cycle(n: Any, d: Any) -> Any:
    """The tick's place in its device's request cycle."""
    return (n + 7 * d) % CYCLE


def _phase(c: Any, where: Where, labels: Sequence[Any]) -> Any:
    """``labels`` (prefill, decode, idle) by cycle place: 3 prefill ticks, 24 decode, 10 idle."""
    return where(c < 3, labels[0], where(c < 27, labels[1], labels[2]))


def _counters(n: Any, d: Any, c: Any, h: History, where: Where) -> dict[str, Any]:
    """Every counter of SAMPLE_COUNTER_FIELDS at tick ``n`` of device ``d``; None: not
    measured (NULL)."""
    noise = (n * 2654435761 + h.seed * 97 + d * 131) % 1000
    busy = where(c < 27, c, 0)
    minutes = n // max(1, int(h.hz * 60))
    leak = where(d == LEAKING_DEVICE, minutes * MIB, 0)
    alloc = 16 * GIB + d * (GIB // 4) + busy * (64 * MIB) + noise * 65536 + leak
    reserved = alloc + 2 * GIB
    values = {
        "allocated_bytes": alloc,
        "reserved_bytes": reserved,
        "active_bytes": alloc + noise * 1024,
        "inactive_split_bytes": noise * (MIB // 2),
        "requested_bytes": alloc - noise * 512,
        "largest_free_block_bytes": None,
        "num_alloc_retries": n // max(1, int(h.hz * 3600)),
        "num_ooms": 0,
        "device_used_bytes": reserved + 3 * GIB // 2,
        "device_total_bytes": 141 * GIB,
        "kv_blocks_used": busy * 120 + noise % 50,
        "kv_blocks_total": 4096,
        "kv_blocks_cached": noise % 100,
        "kv_tokens_used": busy * 1900 + noise,
    }
    assert tuple(values) == SAMPLE_COUNTER_FIELDS
    return values


# -- raw rows: SQL ----------------------------------------------------------------------------


class _Sql:
    """An integer SQL expression that combines with ints and other expressions the way a
    tensor does (``+ - * // %``, ``<``, ``==``), so the closed forms are written once. Every
    operand is a non-negative integer, where SQL's ``/`` is ``//``; ticks and devices are
    BIGINT (see :func:`_ticks_cte`), so PostgreSQL computes in 64 bits as SQLite does."""

    __slots__ = ("sql",)
    __hash__ = None  # type: ignore[assignment]  # == builds SQL, not a truth value

    def __init__(self, sql: str) -> None:
        self.sql = sql

    def _op(self, op: str, other: object, swapped: bool = False) -> _Sql:
        a, b = self.sql, _render(other)
        return _Sql(f"({b} {op} {a})" if swapped else f"({a} {op} {b})")

    def __add__(self, other: object) -> _Sql:
        return self._op("+", other)

    def __radd__(self, other: object) -> _Sql:
        return self._op("+", other, swapped=True)

    def __sub__(self, other: object) -> _Sql:
        return self._op("-", other)

    def __mul__(self, other: object) -> _Sql:
        return self._op("*", other)

    def __rmul__(self, other: object) -> _Sql:
        return self._op("*", other, swapped=True)

    def __floordiv__(self, other: object) -> _Sql:
        return self._op("/", other)

    def __mod__(self, other: object) -> _Sql:
        return self._op("%", other)

    def __lt__(self, other: object) -> _Sql:
        return self._op("<", other)

    def __eq__(self, other: object) -> _Sql:  # type: ignore[override]
        return self._op("=", other)


def _render(x: object) -> str:
    if isinstance(x, _Sql):
        return x.sql
    if x is None:
        return "NULL"
    if isinstance(x, int):
        return str(x)
    raise TypeError(f"not an SQL integer expression: {x!r}")


def _case(cond: Any, then: Any, other: Any) -> _Sql:
    return _Sql(f"(CASE WHEN {_render(cond)} THEN {_render(then)} ELSE {_render(other)} END)")


N, D = _Sql("n"), _Sql("d")


def _ticks_cte(h: History, ids: list[int], first: int) -> str:
    devices = " UNION ALL ".join(f"SELECT {i} AS dev, CAST({pos} AS BIGINT) AS d"
                                 for pos, i in enumerate(ids))
    return (f"WITH RECURSIVE tick(n) AS (SELECT CAST({first} AS BIGINT) UNION ALL "
            f"SELECT n + 1 FROM tick WHERE n < {h.ticks - 1}), dev(dev, d) AS ({devices}) ")


def _samples_sql(h: History, ids: list[int], first: int) -> str:
    """One torch row per device per tick from tick ``first`` on."""
    c = _cycle(N, D)
    values = _counters(N, D, c, h, _case)
    phase = _phase(c, _case, tuple(_Sql(f"'{p.value}'") for p in _CYCLE_PHASES))
    cols = ", ".join(SAMPLE_COUNTER_FIELDS)
    return (_ticks_cte(h, ids, first)
            + f"INSERT INTO samples (device_id, ts_s, phase, source, pid, {cols}) "
            f"SELECT dev, {_ts_sql(h)}, {phase.sql}, '{SOURCE}', 1000 + d, "
            f"{', '.join(_render(v) for v in values.values())} FROM tick, dev ORDER BY n, dev")


def _ts_sql(h: History) -> str:
    return f"({h.start_s!r} + CAST(n AS DOUBLE PRECISION) / {float(h.hz)!r})"


def _events_sql(h: History, ids: list[int], first: int) -> str:
    """A request starts at each cycle's first tick and ends when decode does."""
    c = _cycle(N, D)
    name = _case(c == 0, _Sql("'request_start'"), _Sql("'request_end'"))
    rid = f"('r' || d || '-' || {_render((N + 7 * D) // CYCLE)})"
    return (_ticks_cte(h, ids, first)
            + "INSERT INTO events (device_id, ts_s, name, pid, phase, request_id) "
            f"SELECT dev, {_ts_sql(h)}, {name.sql}, 1000 + d, NULL, {rid} "
            f"FROM tick, dev WHERE {_render(c)} IN (0, 27) ORDER BY n, dev")


# -- the tiers: tensors -----------------------------------------------------------------------


def write_tiers(store: Store, h: History, ids: list[int]) -> None:
    """The per-second rows and minute rollups of every minute of ``h``, from the closed forms:
    a day of one device at a time, each chunk whole minutes."""
    lo = _floor_minute(h.start_s)
    hi = _floor_minute(h.ts(h.ticks - 1)) + MINUTE_S
    span = CHUNK_MINUTES * MINUTE_S
    with store.engine.begin() as c:
        for d, device_id in enumerate(ids):
            t = lo
            while t < hi:
                a, b = h.tick_at(t), h.tick_at(t + span)
                if a < b:
                    packed, minutes, counts = _tiers(h, device_id, d, a, b)
                    c.execute(insert(seconds), packed)
                    c.execute(insert(rollups), minutes)
                    if counts:
                        c.execute(insert(event_counts), counts)
                    # the chunk's ten-minute groups, as retention makes them (a group across
                    # the chunk's end is made again, whole, with the next chunk)
                    refresh_ten_minutes(c, [device_id], t, t + span)
                t += span


def _tiers(h: History, device_id: int, d: int, a: int, b: int
           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(seconds rows, rollup rows, event counts) of ticks [a, b) of device ``d``, whole
    minutes.

    Grouped as ``seconds.summarize`` and ``maintenance.aggregate`` group raw rows: a tick's
    second is ``floor(ts)`` of its float time, its minute that second's; per second the
    count, the last tick's phase and each counter's min / max / last; per minute min, max,
    last, count and the mean as ``sum / count`` of Python ints."""
    import torch

    n = torch.arange(a, b, dtype=torch.int64)
    # tensor / tensor: a true division per element, as SQL's (no reciprocal for a scalar)
    ts = n.double() / torch.full(n.shape, float(h.hz), dtype=torch.float64) + h.start_s
    sec_ids, per_sec = torch.unique_consecutive(ts.floor().long(), return_counts=True)
    sec_of = torch.repeat_interleave(torch.arange(len(sec_ids)), per_sec)  # tick -> second
    sec_last = per_sec.cumsum(0) - 1  # each second's last tick
    min_ids, per_min = torch.unique_consecutive(sec_ids // 60 * 60, return_counts=True)
    min_of = torch.repeat_interleave(torch.arange(len(min_ids)), per_min)  # second -> minute
    min_last = per_min.cumsum(0) - 1  # each minute's last second
    tick_min = min_of[sec_of]
    samples_per_min = torch.zeros(len(min_ids), dtype=torch.int64).index_add_(0, min_of, per_sec)

    c = _cycle(n, d)
    codes = tuple(tier.PHASES.index(p) for p in _CYCLE_PHASES)
    phases = _phase(c, _where, codes)[sec_last].tolist()
    lows: list[Any] = []
    highs: list[Any] = []
    lasts: list[Any] = []
    minute_stats: dict[str, tuple[list[int], ...]] = {}
    for field, v in _counters(n, d, c, h, _where).items():
        if v is None:
            lows.append(repeat(None))
            highs.append(repeat(None))
            lasts.append(repeat(None))
            continue
        v = v if isinstance(v, torch.Tensor) else torch.full(n.shape, v, dtype=torch.int64)
        low = _segment(v, sec_of, len(sec_ids), "amin")
        high = _segment(v, sec_of, len(sec_ids), "amax")
        last = v[sec_last]
        total = torch.zeros(len(min_ids), dtype=torch.int64).index_add_(0, tick_min, v)
        minute_stats[field] = (_segment(low, min_of, len(min_ids), "amin").tolist(),
                               _segment(high, min_of, len(min_ids), "amax").tolist(),
                               last[min_last].tolist(), total.tolist())
        lows.append(low.tolist())
        highs.append(high.tolist())
        lasts.append(last.tolist())

    secs = list(map(tier.Second, sec_ids.double().tolist(), per_sec.tolist(),
                    [tier.PHASES[p] for p in phases], zip(*lows), zip(*highs), zip(*lasts)))
    minutes = min_ids.double().tolist()
    packed = []
    first = 0
    for minute, k in zip(minutes, per_min.tolist(), strict=True):
        packed.append({"device_id": device_id, "minute_s": minute, "source": SOURCE,
                       "seconds": k, "data": tier.pack(secs[first:first + k])})
        first += k
    counts = _event_counts(h, device_id, minutes, c, tick_min) if h.events else []
    return (packed, _rollup_rows(device_id, minutes, samples_per_min.tolist(), minute_stats),
            counts)


def _event_counts(h: History, device_id: int, minutes: list[float], c: Any,
                  tick_min: Any) -> list[dict[str, Any]]:
    """The ``event_counts`` rows of the request events :func:`_events_sql` writes (a start at
    cycle place 0, an end at 27), per minute, in primary key order (device, minute, name)."""
    import torch

    per_name = {name: torch.zeros(len(minutes), dtype=torch.int64)
                .index_add_(0, tick_min, (c == place).long()).tolist()
                for name, place in (("request_end", 27), ("request_start", 0))}
    return [{"device_id": device_id, "minute_s": minute, "name": name, "count": n[i]}
            for i, minute in enumerate(minutes) for name, n in per_name.items() if n[i]]


def _rollup_rows(device_id: int, minutes: list[float], counts: list[int],
                 stats: dict[str, tuple[list[int], ...]]) -> list[dict[str, Any]]:
    """The rollups table's rows, in its primary key's order (device, minute, source, metric)."""
    out = []
    metrics = sorted(stats)
    for i, (minute, count) in enumerate(zip(minutes, counts, strict=True)):
        for metric in metrics:
            low, high, last, total = stats[metric]
            out.append({"device_id": device_id, "bucket_s": minute, "source": SOURCE,
                        "metric": metric, "min_value": low[i], "max_value": high[i],
                        "mean_value": total[i] / count, "last_value": last[i],
                        "count": count})
    return out


def _where(cond: Any, then: Any, other: Any) -> Any:
    """Tensors' CASE; a plain bool (the device's own position) picks a branch."""
    import torch

    if isinstance(cond, bool):
        return then if cond else other
    return torch.where(cond, then, other)


def _segment(values: Any, group: Any, groups: int, how: str) -> Any:
    """``how`` ("amin" / "amax") of ``values`` per ``group`` index (0 .. groups - 1)."""
    import torch

    out = torch.empty(groups, dtype=values.dtype)
    return out.scatter_reduce_(0, group, values, how, include_self=False)


def _floor_minute(ts_s: float) -> float:
    return (ts_s // MINUTE_S) * MINUTE_S


def roll_up_all(store: Store, start_s: float, end_s: float) -> None:
    """The tiers of raw samples already in the store over [start_s, end_s), made as retention
    makes them (``maintenance.rollup_window``, whole minutes)."""
    from vramscope.agent.store import maintenance

    maintenance.rollup_window(store, _floor_minute(start_s), -(-end_s // MINUTE_S) * MINUTE_S)
