"""Real GPU recordings with their ground truth, scored beside the simulated suite.

The recordings live in the repository's ``tests/data/`` (trace v1, made on the H200 through the
product: ``tests/gpu/verify_hooks.py``, ``tests/gpu/record_cublas_leak.py``,
``tests/gpu/record_serving.py``). ``tests/data/gpu_recordings.json`` lists them with their truth;
a recording made by ``record_serving.py`` carries its own truth beside it
(``<trace>.truth.json``) and is found without being listed. Each is analyzed with the default
settings (``analyze_records(..., config=None)``: no tuning per recording) and scored: leak found,
delay after the leak began, slope against the true rate, alerts on a leak-free span (false
alarms, also per day), OOM warning lead and the diagnosed cause.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramscope.agent.alerts.offline import analyze_records
from vramscope.agent.analysis.thresholds import Thresholds
from vramscope.agent.trace import read_trace

REGISTRY = "gpu_recordings.json"


def data_dir() -> Path | None:
    """The repository's tests/data (absent from an installed wheel: then no recordings)."""
    here = Path(__file__).resolve().parents[2] / "tests" / "data"
    return here if here.is_dir() else None


@dataclass
class RealRecording:
    name: str
    path: Path
    leak: bool
    leak_bytes_per_s: float | None = None
    leak_start_ts: float | None = None
    oom: bool = False
    note: str = ""


@dataclass
class RealScore:
    name: str
    duration_s: float
    leak: bool
    detected: bool
    delay_s: float | None
    slope_ratio: float | None  # found slope / true slope
    false_alarms: int
    false_alarms_per_day: float
    oom: bool
    oom_lead_s: float | None
    cause: str | None
    windows: dict[str, Any] | None = None
    alerts: list[str] = field(default_factory=list)
    state: str = "no_leak"  # the leak verdict's state at the end

    @property
    def short(self) -> bool:
        """Shorter than the default warm-up plus minimum span (and two minutes of slack): a
        verdict is not due, the right answer is insufficient_data."""
        t = Thresholds()
        return self.duration_s < t.leak_warmup_s + t.leak_min_span_s + 120.0

    @property
    def right(self) -> bool:
        """A short recording: insufficient_data and no alert. A longer one: a leak found within
        1.5x of its rate, none on a healthy run. Always: no false alarm, and an OOM warned
        before it happened."""
        if self.short:
            leak_ok = self.state == "insufficient_data" or self.detected == self.leak
        elif self.leak:
            leak_ok = self.detected and self.slope_ratio is not None \
                and 1 / 1.5 <= self.slope_ratio <= 1.5
        else:
            leak_ok = not self.detected
        oom_ok = (self.oom_lead_s is not None and self.oom_lead_s > 0) if self.oom else True
        return leak_ok and oom_ok and self.false_alarms == 0


def recordings(directory: Path | None = None) -> list[RealRecording]:
    """The listed recordings, then every ``*.truth.json`` one, that exist in ``directory``."""
    directory = directory or data_dir()
    if directory is None:
        return []
    out: list[RealRecording] = []
    registry = directory / REGISTRY
    if registry.exists():
        for item in json.loads(registry.read_text(encoding="utf-8"))["recordings"]:
            path = directory / item["trace"]
            if path.exists():
                out.append(RealRecording(item["name"], path, bool(item["leak"]),
                                         item.get("leak_bytes_per_s"), item.get("leak_start_ts"),
                                         bool(item.get("oom", False)), item.get("note", "")))
    listed = {r.path.name for r in out}
    for truth_path in sorted(directory.glob("*.jsonl.truth.json")):
        trace = truth_path.with_name(truth_path.name[:-len(".truth.json")])
        if not trace.exists():  # a long recording, kept compressed
            trace = trace.with_name(trace.name + ".gz")
        if trace.name not in listed and trace.exists():
            out.append(from_truth(trace, json.loads(truth_path.read_text(encoding="utf-8"))))
    return out


def from_truth(trace: Path, truth: dict[str, Any]) -> RealRecording:
    """A recording from ``record_serving.py``'s truth file."""
    leak = truth["leak"]
    return RealRecording(trace.name.split(".jsonl")[0], trace, bool(leak["present"]),
                         leak.get("bytes_per_s"), leak.get("start_ts"),
                         bool(truth.get("oom_expected", False)), leak.get("how", ""))


def score(rec: RealRecording) -> RealScore:
    trace = read_trace(str(rec.path))
    doc = analyze_records(trace.samples, trace.events)
    dev = doc["devices"].get("0") or next(iter(doc["devices"].values()))
    t0 = min(s.ts_s for s in trace.samples)
    t1 = max(s.ts_s for s in trace.samples)
    leak, oom = dev["leak"], dev["oom"]
    start = rec.leak_start_ts if rec.leak_start_ts is not None else t0
    fired = [a for a in doc["alerts"] if a.get("severity") != "info" and a["rule"] != "oom"]
    quiet_end = start if rec.leak else t1
    if rec.oom and oom.get("first_oom_ts") is not None:
        quiet_end = min(quiet_end, oom["first_oom_ts"])
    # on a healthy span any alert is false; an OOM-risk alert before an OOM is not
    false = [a for a in fired if a["fired_ts"] < quiet_end
             and not (rec.oom and a["rule"] == "oom_risk")]
    if not rec.leak:
        false += [a for a in fired if a["rule"] == "memory_leak" and a["fired_ts"] >= quiet_end]
    quiet_days = max(quiet_end - t0, 1.0) / 86400.0
    detected = bool(leak["detected"])
    first = leak.get("first_detected_ts")
    lead = None
    if rec.oom and oom.get("first_oom_ts") is not None and oom.get("first_warning_ts"):
        lead = oom["first_oom_ts"] - oom["first_warning_ts"]
    return RealScore(
        rec.name, t1 - t0, rec.leak, detected,
        first - start if detected and first is not None and rec.leak else None,
        leak["slope_bytes_per_s"] / rec.leak_bytes_per_s
        if detected and rec.leak and rec.leak_bytes_per_s else None,
        len(false), len(false) / quiet_days, rec.oom, lead, oom.get("cause"),
        leak.get("windows"), [f"{a['rule']}@{a['fired_ts'] - t0:.1f}s" for a in fired],
        leak.get("state", "no_leak"))


def to_json(s: RealScore) -> dict[str, Any]:
    return {"name": s.name, "duration_s": round(s.duration_s, 1), "leak": s.leak,
            "detected": s.detected, "delay_s": s.delay_s, "slope_ratio": s.slope_ratio,
            "false_alarms": s.false_alarms, "false_alarms_per_day": s.false_alarms_per_day,
            "oom": s.oom, "oom_lead_s": s.oom_lead_s, "cause": s.cause, "windows": s.windows,
            "alerts": s.alerts, "state": s.state, "right": s.right}
