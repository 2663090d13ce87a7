"""OOM scenarios with a known cause: what the diagnosis must name and how early the alerts speak.

Seeded, small simulated recordings (one sample a second on the 80 GiB device of
:mod:`tools.bench.labelled_recordings`), each with its ground truth:

- ``load_ramp``: continuous batching whose arrival rate ramps up until the requests in flight
  (each with its growing KV cache) no longer fit: many requests in flight, the floor flat. The
  cause is ``load``, not ``growth``.
- ``frag_long``: allocated memory near 60-70 % of the limit, reserved at 95 % or more for an
  hour, the allocator retrying more and more often and no allocator snapshot (no largest free
  block): a long prompt then fails with 1.4x its size free. The cause is ``fragmentation``, and
  the warning must hold from the first retries to the OOM, not come and go.
- ``kv_exhaustion``: a preallocated KV pool whose used blocks trend up (requests churning
  around the trend) past 80 % for minutes until the pool refuses blocks. The cause is
  ``kv_exhaustion``, warned from the fill trend well before the end.
- ``tight``: a genuinely tight server (its KV peaks plus the largest prefill come within 5 % of
  the limit in about half of its cycles) that never runs out, for 12 hours: it must hold at
  most one alert, not flap.

Each recording goes through the offline analysis (:func:`analyze_records`, the defaults), as
``vramscope analyze`` would: :func:`score` gives the cause it named, the lead of the first
warning or critical alert before the OOM and the alerts fired. :func:`figures` reports them for
``vramscope bench detection``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from vramscope.agent.alerts.offline import analyze_records
from vramscope.agent.records import Event, Phase, Sample

from tools.bench import Figure
from tools.bench.labelled_recordings import (
    CONTEXT_BYTES,
    GIB,
    LIMIT_BYTES,
    START_S,
    Cycle,
)

TOP_BYTES = LIMIT_BYTES - CONTEXT_BYTES  # what the allocator can reserve
WEIGHTS_BYTES = int(0.30 * LIMIT_BYTES)
TARGET_LEAD_S = 30.0
MAX_TIGHT_ALERTS = 1


@dataclass
class OomScenario:
    name: str
    samples: list[Sample]
    events: list[Event]
    cause: str | None  # the truth; None: no OOM
    oom_ts: float | None = None
    duration_s: float = 0.0


@dataclass
class OomScore:
    name: str
    truth: str | None
    cause: str | None
    lead_s: float | None  # first warning or critical alert before the OOM; None: none
    alerts: int  # warning and critical alerts fired (the ``oom`` alert itself aside)
    rules: list[str] = field(default_factory=list)

    @property
    def right(self) -> bool:
        if self.truth is None:  # no OOM: no more than one alert, held
            return self.alerts <= MAX_TIGHT_ALERTS
        lead_ok = self.lead_s is not None and self.lead_s >= TARGET_LEAD_S
        return self.cause == self.truth and lead_ok


def _sample(t: float, phase: Phase, allocated: int, reserved: int, *, retries: int = 0,
            ooms: int = 0, kv: tuple[int, int] | None = None) -> Sample:
    used, total = kv if kv is not None else (None, None)
    return Sample(t, 0, phase, "sim", allocated_bytes=allocated, reserved_bytes=reserved,
                  active_bytes=allocated, inactive_split_bytes=int(0.01 * reserved),
                  requested_bytes=allocated, num_alloc_retries=retries, num_ooms=ooms,
                  device_used_bytes=reserved + CONTEXT_BYTES, device_total_bytes=LIMIT_BYTES,
                  kv_blocks_used=used, kv_blocks_total=total)


def _oom_event(t: float, phase: Phase, failed: int) -> Event:
    return Event(t, "oom", 0, phase=phase,
                 data={"message": f"CUDA out of memory. Tried to allocate {failed / GIB:.2f} GiB",
                       "failed_alloc_bytes": failed})


# --- load ramp ---------------------------------------------------------------------------------
@dataclass
class _Request:
    rid: str
    start: float
    end: float
    kv_bytes: int  # at its end; its KV cache grows linearly to this
    prompt_bytes: int  # activations of its prefill (its first second)

    def bytes_at(self, t: float) -> int:
        if t < self.start + 1.0:
            return self.prompt_bytes
        return int(self.kv_bytes * (t - self.start) / (self.end - self.start))


def load_ramp(seed: int, ramp_s: float = 2400.0) -> OomScenario:
    """Arrivals ramp from 0.08/s to 2.5/s over ``ramp_s``; each request decodes 60-120 s while
    its KV cache grows to 0.5-1 % of the device. The floor (weights) never moves."""
    rng = random.Random(seed)
    samples: list[Sample] = []
    events: list[Event] = []
    running: list[_Request] = []
    next_arrival, reserved, n = START_S + rng.expovariate(0.08), 0, 0
    t = START_S
    while t < START_S + 2 * ramp_s:
        rate = 0.08 + (2.5 - 0.08) * min(1.0, (t - START_S) / ramp_s)
        while next_arrival <= t:
            r = _Request(f"r{n}", next_arrival, next_arrival + rng.uniform(60, 120),
                         int(rng.uniform(0.005, 0.010) * LIMIT_BYTES),
                         int(rng.uniform(0.002, 0.004) * LIMIT_BYTES))
            n += 1
            running.append(r)
            events.append(Event(r.start, "request_start", 0, request_id=r.rid))
            next_arrival += rng.expovariate(rate)
        for r in [r for r in running if r.end <= t]:
            running.remove(r)
            events.append(Event(r.end, "request_end", 0, request_id=r.rid))
        prefill = any(t < r.start + 1.0 for r in running)
        phase = Phase.PREFILL if prefill else Phase.DECODE if running else Phase.IDLE
        noise = abs(int(rng.gauss(0, 0.0005) * LIMIT_BYTES))
        allocated = WEIGHTS_BYTES + sum(r.bytes_at(t) for r in running) + noise
        if allocated > TOP_BYTES:  # the request that did not fit
            shown = min(allocated, reserved)
            samples.append(_sample(t, phase, shown, reserved, ooms=1))
            events.append(_oom_event(t, phase, allocated - shown))
            events.sort(key=lambda e: e.ts_s)
            return OomScenario(f"load_ramp/{seed}", samples, events, "load", t, t - START_S)
        reserved = min(TOP_BYTES, max(reserved, allocated + GIB))
        samples.append(_sample(t, phase, allocated, reserved))
        t += 1.0
    raise AssertionError(f"load_ramp/{seed}: the simulated server never ran out of memory")


# --- fragmentation -----------------------------------------------------------------------------
def _cycles(rng: random.Random, amp: tuple[float, float], fill_share: float = 1.0
            ) -> Iterator[tuple[float, Phase, float, int]]:
    """``(t, phase, KV fill 0-1 of the cycle's amplitude, activation bytes)`` one a second, in
    serving cycles (idle 0-10 s, prefill 1-3 s of 2-4 % of the device, decode 60-120 s whose KV
    fills to its amplitude over ``fill_share`` of the decode, then holds)."""
    t = START_S
    while True:
        c = Cycle(t, rng.uniform(0, 10), rng.uniform(1, 3), rng.uniform(60, 120),
                   int(rng.uniform(0.02, 0.04) * LIMIT_BYTES), rng.uniform(*amp))
        while t < c.start + c.length_s:
            p = t - c.start
            if p < c.idle_s:
                yield t, Phase.IDLE, 0.0, 0
            elif p < c.idle_s + c.prefill_s:
                yield t, Phase.PREFILL, 0.0, c.spike
            else:
                decode = c.length_s - c.idle_s - c.prefill_s
                fill = min(1.0, (p - c.idle_s - c.prefill_s) / (fill_share * decode))
                yield t, Phase.DECODE, c.kv_amp * fill, int(0.005 * LIMIT_BYTES)
            t += 1.0


def frag_long(seed: int, fragment_s: float = 1200.0, hold_s: float = 3600.0) -> OomScenario:
    """Reserved climbs to 95-98 % of the limit over ``fragment_s`` and stays there; from then
    on prefills make the allocator retry (more and more often over ``hold_s``); then a long
    prompt needs 1/1.4 of the free memory under the limit and finds no block."""
    rng = random.Random(seed)
    samples: list[Sample] = []
    retries, reserved = 0, 0
    for t, phase, fill, act in _cycles(rng, (0.05, 0.10)):
        age = t - START_S
        allocated = int((0.58 + fill) * LIMIT_BYTES) + act \
            + abs(int(rng.gauss(0, 0.0005) * LIMIT_BYTES))
        reserved = max(reserved, min(TOP_BYTES, allocated + GIB),
                       int(min(0.97, 0.60 + 0.37 * age / fragment_s) * TOP_BYTES))
        if age >= fragment_s and phase is Phase.PREFILL:
            pressure = min(1.0, (age - fragment_s) / hold_s)
            retries += rng.random() < 0.05 + 0.5 * pressure
        if age >= fragment_s + hold_s and phase is Phase.PREFILL:
            free = TOP_BYTES - allocated  # cached free plus what may still be reserved
            failed = int(free / 1.4)
            samples.append(_sample(t, phase, allocated, reserved, retries=retries + 1, ooms=1))
            return OomScenario(f"frag_long/{seed}", samples, [_oom_event(t, phase, failed)],
                               "fragmentation", t, age)
        samples.append(_sample(t, phase, allocated, reserved, retries=retries))
    raise AssertionError("unreachable: the cycles never end")


# --- KV pool exhaustion ------------------------------------------------------------------------
KV_BLOCKS = 4000
KV_BLOCK_BYTES = int(0.60 * LIMIT_BYTES) // KV_BLOCKS


def kv_exhaustion(seed: int, fill_from: float = 0.40, fill_s: float = 1000.0) -> OomScenario:
    """A pool of 60 % of the device, preallocated after 60 s, whose used blocks trend from
    ``fill_from`` to full over ``fill_s`` (past 80 % for the last third of it) in a sawtooth:
    the scheduler admits a batch every 25-45 s (used blocks jump by 5-8 % of the pool) and the
    requests of earlier batches finish in between (used blocks fall back). When the pool has no
    block for a new request it refuses it (``kv_alloc_failed``) and the server fails the
    allocation of the blocks it asked for: the OOM."""
    rng = random.Random(seed)
    samples: list[Sample] = []
    events: list[Event] = []
    pool = int(0.60 * LIMIT_BYTES)
    t, admitted, jump, period = START_S, START_S + 60, 0.0, 0.0
    while True:
        age = t - START_S
        if age < 60:  # loading the weights, then allocating the pool
            allocated = WEIGHTS_BYTES + (pool if age >= 50 else 0)
            samples.append(_sample(t, Phase.SETUP, allocated, allocated + GIB))
            t += 1.0
            continue
        if t >= admitted + period:  # the next batch
            admitted, jump, period = t, rng.uniform(0.05, 0.08), rng.uniform(25, 45)
        trend = fill_from + (1.0 - fill_from) * (age - 60) / fill_s
        # just after admission the batch's blocks are all there; they drain until the next
        churn = jump * (0.5 - (t - admitted) / period) + rng.gauss(0, 0.003)
        phase = Phase.PREFILL if t - admitted < 2 else Phase.DECODE
        act = int(0.02 * LIMIT_BYTES) if phase is Phase.PREFILL else int(0.005 * LIMIT_BYTES)
        allocated = WEIGHTS_BYTES + pool + act
        reserved = WEIGHTS_BYTES + pool + int(0.03 * LIMIT_BYTES)
        if trend + churn >= 1.0:  # no block left for the batch
            failed = 64 * KV_BLOCK_BYTES
            events += [Event(t - 0.5, "kv_alloc_failed", 0, request_id=f"r{int(age)}",
                             data={"reason": "not enough free blocks"}),
                       _oom_event(t, phase, failed)]
            samples.append(_sample(t, phase, allocated, reserved, ooms=1,
                                   kv=(KV_BLOCKS, KV_BLOCKS)))
            return OomScenario(f"kv_exhaustion/{seed}", samples, events, "kv_exhaustion", t,
                               age)
        used = int(max(0.0, trend + churn) * KV_BLOCKS)
        samples.append(_sample(t, phase, allocated, reserved, kv=(used, KV_BLOCKS)))
        t += 1.0


# --- a tight, steady server --------------------------------------------------------------------
def tight(seed: int, hours: float = 12.0) -> OomScenario:
    """KV peaks of 54-60 % of the device over the weights (allocated 86-92 %), reached halfway
    through each decode and held to its end: with the largest prefill (4 %) and the context the
    headroom after a spike dips under 5 % in about half of the cycles, for tens of seconds; it
    never runs out."""
    rng = random.Random(seed)
    samples: list[Sample] = []
    reserved = 0
    end = START_S + hours * 3600.0
    for t, phase, fill, act in _cycles(rng, (0.54, 0.60), fill_share=0.5):
        if t >= end:
            break
        allocated = WEIGHTS_BYTES + int((0.02 + fill) * LIMIT_BYTES) + act \
            + abs(int(rng.gauss(0, 0.0005) * LIMIT_BYTES))
        reserved = min(TOP_BYTES, max(reserved, allocated + GIB))
        samples.append(_sample(t, phase, allocated, reserved))
    return OomScenario(f"tight/{seed}", samples, [], None, None, hours * 3600.0)


# --- scoring -----------------------------------------------------------------------------------
def scenarios(quick: bool = False) -> list[OomScenario]:
    seeds = (1,) if quick else (1, 2, 3)
    out: list[OomScenario] = []
    for seed in seeds:
        out += [load_ramp(seed), frag_long(seed), kv_exhaustion(seed)]
    out += [tight(seed, hours=2.0 if quick else 12.0) for seed in seeds]
    return out


def score(sc: OomScenario) -> OomScore:
    """The scenario through offline analysis with the default settings."""
    doc = analyze_records(sc.samples, sc.events)
    oom = doc["devices"]["0"]["oom"]
    fired = [a for a in doc["alerts"] if a["rule"] != "oom" and a["severity"] != "info"]
    lead = None
    if sc.oom_ts is not None:
        before = [a["fired_ts"] for a in fired if a["fired_ts"] <= sc.oom_ts]
        lead = sc.oom_ts - min(before) if before else None
    return OomScore(sc.name, sc.cause, oom["cause"], lead, len(fired),
                    [a["rule"] for a in fired])


def figures(quick: bool = False) -> list[Figure]:
    """Per kind: causes right, the shortest warning lead, the most alerts fired."""
    scores = [score(sc) for sc in scenarios(quick)]
    out = []
    ooms = [s for s in scores if s.truth is not None]
    right = sum(s.cause == s.truth for s in ooms)
    out.append(Figure("detection", "OOM scenarios: causes right", float(right), "of "
                      f"{len(ooms)}", spread=", ".join(f"{s.name}: {s.cause}" for s in ooms),
                      target=f"{len(ooms)}", met=right == len(ooms)))
    leads = [s.lead_s for s in ooms]
    known = [x for x in leads if x is not None]
    out.append(Figure("detection", "OOM scenarios: min warning lead", min(known, default=0.0),
                      "s", spread=", ".join(f"{s.name}: " + ("none" if s.lead_s is None
                                                           else f"{s.lead_s:.0f} s")
                                          for s in ooms),
                      target=">= 30", met=len(known) == len(leads)
                      and min(known, default=0.0) >= TARGET_LEAD_S))
    tights = [s for s in scores if s.truth is None]
    out.append(Figure("detection", "tight steady server: alerts fired",
                      float(max((s.alerts for s in tights), default=0)), "alerts",
                      spread=", ".join(f"{s.name}: {s.alerts}" for s in tights),
                      target="<= 1", met=all(s.right for s in tights)))
    return out
