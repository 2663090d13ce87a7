"""Prefill-spike OOMs warned from the configuration (``vramscope bench detection``'s part).

A server with a flat floor then gets one request of 16 sequences × 16,000 tokens. Nothing in
the memory before it foresees the spike; the ``[server]`` section does: the alert engine, given
the same settings a user writes (a model ``config.json`` and vLLM's admission limits), raises
``config_oom`` from the first sample that carries the device's limit. Each scenario is run
through :class:`~vramscope.agent.alerts.engine.AlertEngine` twice, with the ``[server]``
section and without it (the baseline: the trend, headroom and leak rules alone), and scored:

- an OOM scenario is *warned from the configuration* when ``config_oom`` fired before the big
  request arrived; its lead is the time from that alert to the OOM;
- a scenario whose worst request fits (a larger GPU, a chunked prefill) serves the big request
  without an OOM and must raise no ``config_oom``.

The simulated server holds what the estimator counts, with the prefill's activations at 85 % of
the estimator's allowance (the allowance is an upper bound on one layer's temporaries), so an
OOM here is an OOM the formulas alone did not manufacture.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramscope.agent.alerts.config_check import server_from_config
from vramscope.agent.alerts.engine import AlertEngine
from vramscope.agent.config import Config, parse_config
from vramscope.agent.estimate import GiB, MiB
from vramscope.agent.records import Event, Phase, Sample

from tools.bench import Figure

START_S = 1_700_000_000.0
PID = 4321
ACTIVATION_SHARE = 0.85  # of the estimator's allowance, actually held at the prefill peak
# Llama-3-8B's shape (config.json keys as transformers writes them)
LLAMA_8B: dict[str, Any] = {
    "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 128256, "torch_dtype": "bfloat16", "max_position_embeddings": 131072}
BIG_SEQS, BIG_TOKENS = 16, 16_000  # the one request after the flat floor
ADMITS = {"max_model_len": BIG_TOKENS, "max_num_seqs": BIG_SEQS}


@dataclass(frozen=True)
class ConfigScenario:
    name: str
    server: dict[str, Any]  # the [server] table, less the model
    device_total_bytes: int  # NVML's
    cap_bytes: int | None = None  # a per-process cap (set_per_process_memory_fraction)

    @property
    def limit_bytes(self) -> int:
        return self.cap_bytes or self.device_total_bytes


L40S, H100, H200 = 46068 * MiB, 81559 * MiB, 143771 * MiB
SCENARIOS: tuple[ConfigScenario, ...] = (
    # cannot fit: the worst request needs 68.70 GiB
    ConfigScenario("L40S, KV grows per request", dict(ADMITS), L40S),
    ConfigScenario("H100 capped at 50 %", dict(ADMITS), H100, cap_bytes=H100 // 2),
    ConfigScenario("H100, 48 GiB KV pool, whole prompts", {**ADMITS, "kv_pool_gib": 48.0}, H100),
    ConfigScenario("H200, 118 GiB KV pool, 128k-token chunks",
                   {**ADMITS, "kv_pool_gib": 118.0, "max_num_batched_tokens": 131072}, H200),
    # fits: the same request is served
    ConfigScenario("H200, KV grows per request", dict(ADMITS), H200),
    ConfigScenario("H100, 48 GiB KV pool, 8k-token chunks",
                   {**ADMITS, "kv_pool_gib": 48.0, "max_num_batched_tokens": 8192}, H100),
)


@dataclass
class Recording:
    samples: list[Sample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    request_ts: float = 0.0
    oom_ts: float | None = None


@dataclass(frozen=True)
class Outcome:
    name: str
    oom: bool
    warned_ts: float | None  # config_oom fired (None: never)
    request_ts: float
    oom_ts: float | None
    baseline_warned: bool  # any warning or critical before the request, without [server]

    @property
    def warned_before_request(self) -> bool:
        return self.warned_ts is not None and self.warned_ts < self.request_ts

    @property
    def lead_s(self) -> float | None:
        if self.oom_ts is None or not self.warned_before_request:
            return None
        assert self.warned_ts is not None
        return self.oom_ts - self.warned_ts


def simulate(sc: ConfigScenario, floor_s: float, config: Config, seed: int = 0) -> Recording:
    """``floor_s`` of small requests on a flat floor (1 s samples), then the big request,
    prefilled in chunks of ``max_num_batched_tokens`` (or whole), one chunk a second; an OOM
    ends it the moment what it holds passes the limit."""
    limits = server_from_config(config)
    assert limits is not None
    shape, a = limits.shape, limits.admission
    rng = random.Random(seed)
    weights = int(shape.num_params * 2)
    floor = weights + int(0.6 * GiB) + (a.kv_pool_bytes or 0)  # runtime: under the allowance
    kv_tok = shape.kv_bytes_per_token(limits.kv_dtype)
    act_tok = int(ACTIVATION_SHARE * (4 * shape.hidden_size + 2 * shape.intermediate_size) * 2)
    rec = Recording()
    t = START_S
    while t < START_S + floor_s:  # small requests: 4 x 512 tokens every 15 s, 1 s prefill
        into = (t - START_S) % 15
        busy = 0 if into >= 9 else 4 * 512 * ((act_tok if into < 1 else 0)
                                               + (0 if a.kv_pool_bytes else kv_tok))
        _sample(rec, sc, t, Phase.PREFILL if into < 1 else Phase.DECODE if into < 9
                else Phase.IDLE, floor + busy + rng.randint(0, 8 * MiB))
        t += 1.0
    rec.request_ts = t
    rec.events.append(Event(t, "request_start", 0, PID, Phase.PREFILL, request_id="big"))
    total = BIG_SEQS * BIG_TOKENS
    chunk = a.max_batch_tokens or total
    done = 0
    while done < total:
        t += 1.0
        step = min(chunk, total - done)
        done += step
        kv = 0 if a.kv_pool_bytes else done * kv_tok
        held = floor + kv + step * act_tok + BIG_SEQS * shape.vocab_size * 4
        if held > sc.limit_bytes:
            _oom(rec, sc, t, floor + kv, held - floor - kv)
            return rec
        _sample(rec, sc, t, Phase.PREFILL, held)
    for _ in range(5):  # decode, then done
        t += 1.0
        _sample(rec, sc, t, Phase.DECODE, floor + (0 if a.kv_pool_bytes else total * kv_tok))
    rec.events.append(Event(t, "request_end", 0, PID, Phase.DECODE, request_id="big"))
    return rec


def _sample(rec: Recording, sc: ConfigScenario, t: float, phase: Phase, allocated: int,
            ooms: int = 0) -> None:
    reserved = allocated + 256 * MiB
    rec.samples.append(Sample(t, 0, phase, "torch", PID, allocated_bytes=allocated,
                              reserved_bytes=reserved, device_total_bytes=sc.limit_bytes,
                              num_alloc_retries=ooms, num_ooms=ooms))
    rec.samples.append(Sample(t, 0, Phase.UNKNOWN, "nvml", None,
                              device_used_bytes=reserved + 512 * MiB,
                              device_total_bytes=sc.device_total_bytes))


def _oom(rec: Recording, sc: ConfigScenario, t: float, allocated: int, failed: int) -> None:
    rec.oom_ts = t
    rec.events.append(Event(t, "oom", 0, PID, Phase.PREFILL, data={
        "message": f"CUDA out of memory. Tried to allocate {failed / GiB:.2f} GiB",
        "requested_bytes": failed}))
    _sample(rec, sc, t, Phase.PREFILL, allocated, ooms=1)


def settings(sc: ConfigScenario, model: str) -> Config:
    """The scenario's settings as a user writes them: ``[server]`` with the model's
    ``config.json`` (the path ``model``), read by the engine as a user's would be."""
    return parse_config({"server": {"model": model, **sc.server}}, f"bench: {sc.name}", {})


def write_model(folder: str) -> str:
    path = Path(folder) / "config.json"
    path.write_text(json.dumps(LLAMA_8B))
    return str(path)


def run_scenario(sc: ConfigScenario, floor_s: float, model: str) -> Outcome:
    config = settings(sc, model)
    rec = simulate(sc, floor_s, config)
    records: list[Sample | Event] = [*rec.samples, *rec.events]
    changes = AlertEngine.from_config(config).feed(records)
    warned = next((c.ts_s for c in changes if c.rule == "config_oom" and c.kind == "fired"),
                  None)
    baseline = AlertEngine.from_config(None).feed(records)
    early = any(c.kind == "fired" and c.severity in ("warning", "critical")
                and c.ts_s < rec.request_ts for c in baseline)
    return Outcome(sc.name, rec.oom_ts is not None, warned, rec.request_ts, rec.oom_ts, early)


def figures(quick: bool) -> list[Figure]:
    """Prefill-spike OOMs warned from the configuration before the request (target: all), the
    shortest lead, and ``config_oom`` on servers whose worst request fits (target: none)."""
    with tempfile.TemporaryDirectory(prefix="vramscope-bench-") as folder:
        model = write_model(folder)
        outcomes = [run_scenario(sc, 120.0 if quick else 600.0, model) for sc in SCENARIOS]
    return score_figures(outcomes)


def score_figures(outcomes: Sequence[Outcome]) -> list[Figure]:
    ooms = [o for o in outcomes if o.oom]
    fits = [o for o in outcomes if not o.oom]
    warned = [o for o in ooms if o.warned_before_request]
    leads = [o.lead_s for o in warned if o.lead_s is not None]
    base = sum(o.baseline_warned for o in ooms)
    false = [o.name for o in fits if o.warned_ts is not None]
    return [
        Figure("detection", "prefill-spike OOMs warned from the configuration before the "
               "request", float(len(warned)), f"of {len(ooms)}",
               spread=f"lead {min(leads):.0f}-{max(leads):.0f} s before the OOM" if leads
               else "none warned",
               baseline=f"without [server]: {base} of {len(ooms)} warned before the request",
               target=f"{len(ooms)} (all)", met=bool(ooms) and len(warned) == len(ooms)),
        Figure("detection", "min lead of the configuration warning before a prefill-spike OOM",
               min(leads) if leads else 0.0, "s",
               spread="; ".join(f"{o.name}: {o.lead_s:.0f} s" for o in warned
                                if o.lead_s is not None)),
        Figure("detection", "config_oom on servers whose worst request fits",
               float(len(false)), f"of {len(fits)}",
               spread=", ".join(false) or "the big request served on each, no alert",
               target="0", met=not false and bool(fits)),
    ]
