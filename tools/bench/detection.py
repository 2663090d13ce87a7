"""``vramscope bench detection``: leak and OOM detection on the long suite
(``tools.bench.long_detection``: days of varied serving, the issue-30 targets) and on
the older scenario suite (``tools.bench.labelled_recordings``).

Runs the alert engine with the default settings over every scenario, as the live agent would,
and reports: the share of leaks of at least 0.5 % of the device per hour detected within two
simulated hours of their start (target >= 95 %), the median time to detect, false alarms per
simulated day of leak-free serving (target <= 1 per 7 days; any warning or critical alert in
steady, warm-up and preallocated scenarios, and before a leak starts), and the warning lead time
before each OOM (target: every OOM warned >= 30 s ahead). Beside the suite: the real GPU
recordings (``real_recordings``), the OOM-cause scenarios (``oom_scenarios``: load ramp, long
fragmentation, KV pool exhaustion, a tight server that must not flap) and the prefill-spike OOMs
that only the ``[server]`` configuration can foresee (``config_scenarios``).

The baseline, measured in the same run over the same scenarios, is the naive leak detector many
dashboards use: an ordinary least-squares slope of the raw allocated memory over the last two
hours above the same minimum slope.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from vramscope.agent.alerts.engine import AlertChange, AlertEngine

from tools.bench import (
    BenchOptions,
    Figure,
    config_scenarios,
    long_detection,
    oom_scenarios,
)
from tools.bench.labelled_recordings import Scenario, hard_cases, leak, suite
from tools.bench.real_recordings import RealScore, recordings
from tools.bench.real_recordings import score as score_real

TARGET_RATE = 0.005  # leaks at least this fast must be found...
TARGET_WITHIN_S = 2 * 3600.0  # ...within this long
TARGET_LEAD_S = 30.0
FALSE_ALARMS_PER_DAY = 1 / 7
NAIVE_WINDOW_S = 2 * 3600.0
NAIVE_EVERY_S = 300.0


@dataclass
class DetectionScore:
    leaks: int = 0  # leaks at or above TARGET_RATE
    detected: int = 0  # ...found within TARGET_WITHIN_S
    detect_times_s: list[float] = field(default_factory=list)
    by_rate: dict[float, list[float | None]] = field(default_factory=dict)
    false_alarms: int = 0
    quiet_days: float = 0.0
    leads_s: list[float | None] = field(default_factory=list)  # None: no warning before OOM
    naive_detected: int = 0
    naive_false_alarms: int = 0

    @property
    def detection_rate(self) -> float:
        return self.detected / self.leaks if self.leaks else 0.0

    @property
    def false_alarms_per_day(self) -> float:
        return self.false_alarms / self.quiet_days if self.quiet_days else 0.0


def score(scenarios: Sequence[Scenario]) -> DetectionScore:
    out = DetectionScore()
    for sc in scenarios:
        fired = [c for c in AlertEngine.from_config(None).feed([*sc.samples, *sc.events])
                 if c.kind == "fired" and c.severity != "info"]
        if sc.kind == "leak":
            _score_leak(sc, fired, out)
        elif sc.oom_ts is not None:
            warned = [c.ts_s for c in fired if c.rule != "oom" and c.ts_s <= sc.oom_ts]
            out.leads_s.append(sc.oom_ts - warned[0] if warned else None)
        else:
            out.false_alarms += len(fired)
            out.quiet_days += sc.days
            out.naive_false_alarms += _naive_fires(sc) is not None
    return out


def _score_leak(sc: Scenario, fired: list[AlertChange], out: DetectionScore) -> None:
    start = sc.leak_start_ts
    assert start is not None  # a leak scenario
    before = [c for c in fired if c.ts_s < start]
    out.false_alarms += len(before)
    out.quiet_days += (start - sc.samples[0].ts_s) / 86400.0
    found = [c.ts_s - start for c in fired if c.rule == "memory_leak" and c.ts_s >= start]
    took = found[0] if found and found[0] <= TARGET_WITHIN_S else None
    out.by_rate.setdefault(sc.leak_rate_ratio_per_h, []).append(took)
    naive = _naive_fires(sc)
    if naive is not None and naive < start:
        out.naive_false_alarms += 1
    if sc.leak_rate_ratio_per_h >= TARGET_RATE:
        out.leaks += 1
        if took is not None:
            out.detected += 1
            out.detect_times_s.append(took)
        if naive is not None and start <= naive <= start + TARGET_WITHIN_S:
            out.naive_detected += 1


def _naive_fires(sc: Scenario) -> float | None:
    """First time the OLS slope of raw allocated over the last two hours is over the minimum."""
    limit = sc.samples[0].device_total_bytes or 0  # simulated: always set
    min_slope = 0.0025 * limit / 3600.0
    pts = [(s.ts_s, s.allocated_bytes or 0) for s in sc.samples]  # simulated: always set
    t0, next_eval, lo = pts[0][0], pts[0][0] + 1800.0, 0
    for i, (ts, _) in enumerate(pts):
        if ts < next_eval:
            continue
        next_eval += NAIVE_EVERY_S
        while pts[lo][0] < ts - NAIVE_WINDOW_S:
            lo += 1
        if _ols_slope(pts[lo:i + 1], t0) >= min_slope:
            return ts
    return None


def _ols_slope(pts: Sequence[tuple[float, float]], t0: float) -> float:
    n = len(pts)
    mx = sum(p[0] - t0 for p in pts) / n
    my = sum(p[1] for p in pts) / n
    sxy = sum((p[0] - t0 - mx) * (p[1] - my) for p in pts)
    sxx = sum((p[0] - t0 - mx) ** 2 for p in pts)
    return sxy / sxx if sxx else 0.0


def run(options: BenchOptions) -> list[Figure]:
    scenarios = suite(quick=options.quick)
    s = score(scenarios)
    leads = [x for x in s.leads_s if x is not None]
    naive_rate = s.naive_detected / s.leaks if s.leaks else 0.0
    figures = [
        Figure("detection", "leaks >=0.5%/h found within 2 h", 100 * s.detection_rate, "%",
               spread=f"{s.detected} of {s.leaks}",
               baseline=f"naive OLS slope: {100 * naive_rate:.0f} %", target=">= 95",
               met=s.detection_rate >= 0.95),
        Figure("detection", "median time to detect (>=0.5%/h)",
               statistics.median(s.detect_times_s) if s.detect_times_s else float("nan"), "s",
               spread=_range(s.detect_times_s), target="<= 7200",
               met=bool(s.detect_times_s) and max(s.detect_times_s) <= TARGET_WITHIN_S),
        Figure("detection", "false alarms per simulated day", s.false_alarms_per_day, "/day",
               spread=f"{s.false_alarms} in {s.quiet_days:.2f} days",
               baseline=f"naive OLS slope: {s.naive_false_alarms} in {s.quiet_days:.2f} days",
               target="<= 0.143", met=s.false_alarms_per_day <= FALSE_ALARMS_PER_DAY),
        Figure("detection", "min warning lead before OOM", min(leads) if leads else 0.0, "s",
               spread=f"{len(leads)} of {len(s.leads_s)} OOMs warned; " + _range(leads),
               target=">= 30", met=len(leads) == len(s.leads_s) and min(leads) >= TARGET_LEAD_S),
    ]
    for rate, times in sorted(s.by_rate.items()):
        found = [t for t in times if t is not None]
        figures.append(Figure("detection", f"leak {100 * rate:.2f}%/h found within 2 h",
                              100 * len(found) / len(times), "%",
                              spread=f"{len(found)} of {len(times)}; " + _range(found)))
    return (long_detection.run(options) + figures
            + _hard_figures(score(hard_cases(quick=options.quick)))
            + delay_figures(quick=options.quick)
            + real_figures([score_real(r) for r in recordings()])
            + oom_scenarios.figures(quick=options.quick)
            + config_scenarios.figures(quick=options.quick))


GRID_RATES = (0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16)  # share of the device per hour
QUICK_RATES = (0.005, 0.02, 0.08)
GRID_NOISE = (0.0005, 0.002)  # sd of allocated memory, share of the device (the suite: 0.0005)


def delay_figures(quick: bool = False) -> list[Figure]:
    """Time to detect as a function of the leak rate and the noise, one figure per server
    (one seed each; reported, held to no target): the detector waits for evidence, so a
    faster or cleaner leak is named sooner. "idle gaps": the suite's server, whose floor
    points mix idle moments and decode steps (their activations are not explained); "never
    idle": the floor is the residual after the KV blocks in use, the same level in every
    window. The value is the median delay; the spread lists each leak's."""
    rates = QUICK_RATES if quick else GRID_RATES
    out = []
    for never_idle in (False, True):
        noises = GRID_NOISE[:1] if quick or never_idle else GRID_NOISE
        cells = [(rate, noise, _delay_s(rate, noise, never_idle))
                 for noise in noises for rate in rates]
        found = [took for _, _, took in cells if took is not None]
        server = "never idle" if never_idle else "idle gaps"
        out.append(Figure(
            "detection", f"delay to name a leak by rate and noise ({server})",
            statistics.median(found) if found else float("nan"), "s",
            spread="; ".join(
                f"{100 * rate:g}%/h at noise {100 * noise:g}%: "
                + ("not found within 2 h" if took is None else f"{took / 60:.0f} min")
                for rate, noise, took in cells)))
    return out


def _delay_s(rate: float, noise: float, never_idle: bool) -> float | None:
    """Seconds from the leak's onset to its first ``memory_leak`` alert (None: none)."""
    sc = leak(rate, 7, after_s=2 * 3600, noise_ratio=noise, never_idle=never_idle)
    fired = [c.ts_s for c in AlertEngine.from_config(None).feed([*sc.samples, *sc.events])
             if c.kind == "fired" and c.rule == "memory_leak"]
    start = sc.leak_start_ts or 0.0
    return next((t - start for t in fired if t >= start), None)


def real_figures(scores: Sequence[RealScore]) -> list[Figure]:
    """One figure per real recording (tools/bench/real_recordings.py), analyzed with the
    defaults: right (1) when its leak is found within 1.5x of its rate or none is said, no
    alert fires on its leak-free span and an OOM is warned before it happens."""
    out = []
    for r in scores:
        parts = [f"{r.duration_s:.0f} s"]
        if r.state == "insufficient_data":
            parts.append("insufficient data said" + (" (a leak)" if r.leak else ""))
        elif r.leak:
            found = r.detected and r.delay_s is not None and r.slope_ratio is not None
            parts.append(f"leak found after {r.delay_s:.0f} s, slope x{r.slope_ratio:.2f}"
                         if found else "leak NOT found")
        else:
            parts.append("leak said" if r.detected else "no leak said")
        parts.append(f"{r.false_alarms} false alarms ({r.false_alarms_per_day:.3g}/day)")
        if r.oom:
            parts.append("OOM not warned" if r.oom_lead_s is None else
                         f"OOM warned {r.oom_lead_s:.1f} s ahead")
            parts.append(f"cause {r.cause}")
        if r.windows:
            parts.append(f"floor window {r.windows['floor_s']:.3g} s")
        out.append(Figure("detection", f"real: {r.name}", float(r.right), "right",
                          spread="; ".join(parts), target="1", met=r.right))
    return out


NEVER_IDLE_TARGET = 0.90  # share of never-idle leaks >= 0.5 %/h found within 2 h


def _hard_figures(h: DetectionScore) -> list[Figure]:
    """Never-idle serving (KV cache under a daily load cycle): held to the same false-alarm
    budget as the suite, and >= 90 % of its leaks found within 2 h."""
    return [
        Figure("detection", "never idle: leaks >=0.5%/h found in 2 h", 100 * h.detection_rate,
               "%", spread=f"{h.detected} of {h.leaks}; " + _range(h.detect_times_s),
               target=">= 90", met=h.detection_rate >= NEVER_IDLE_TARGET),
        Figure("detection", "never idle: false alarms per day", h.false_alarms_per_day, "/day",
               spread=f"{h.false_alarms} in {h.quiet_days:.2f} days (daily load cycle)",
               baseline=f"naive OLS slope: {h.naive_false_alarms} in {h.quiet_days:.2f} days",
               target="<= 0.143", met=h.false_alarms_per_day <= FALSE_ALARMS_PER_DAY),
    ]


def _range(values: Sequence[float]) -> str:
    if not values:
        return "none"
    return f"min {min(values):.0f} s / max {max(values):.0f} s over {len(values)}"
