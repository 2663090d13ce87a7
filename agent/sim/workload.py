"""Request traces for the simulator and the allocator benchmark, from a fixed seed.

Arrivals are a Poisson process whose rate switches between a base rate and a burst rate (a
two-state Markov-modulated Poisson process: exponential time in each state), so traffic has
the quiet spells and pile-ups that real chat traffic has. Prompt and output lengths are
log-normal (a long right tail: a few very long prompts), clipped to the model's context.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    request_id: str
    arrival_s: float  # seconds since the start of the trace
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class WorkloadSpec:
    rate_per_s: float = 2.0  # mean arrivals per second outside bursts
    burst_rate_per_s: float = 8.0  # mean arrivals per second during a burst
    mean_calm_s: float = 120.0  # mean length of a calm spell
    mean_burst_s: float = 20.0  # mean length of a burst
    prompt_median_tokens: int = 600
    prompt_sigma: float = 0.9  # log-normal shape: 0.9 puts ~5 % of prompts above 4x the median
    output_median_tokens: int = 200
    output_sigma: float = 0.7
    max_context_tokens: int = 8192
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("rate_per_s", "burst_rate_per_s", "mean_calm_s", "mean_burst_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"Invalid {name}: {value}. Must be > 0")
        if self.max_context_tokens < 2:
            raise ValueError(f"Invalid max_context_tokens: {self.max_context_tokens}. Must be >= 2")


def _lognormal_tokens(rng: random.Random, median: int, sigma: float, low: int, high: int) -> int:
    value = int(round(rng.lognormvariate(math.log(median), sigma)))
    return max(low, min(high, value))


def requests(spec: WorkloadSpec, id_prefix: str = "r") -> Iterator[Request]:
    """An endless, reproducible stream of requests in arrival order."""
    rng = random.Random(spec.seed)
    t_s, bursting, state_left_s, n = 0.0, False, rng.expovariate(1 / spec.mean_calm_s), 0
    while True:
        rate = spec.burst_rate_per_s if bursting else spec.rate_per_s
        gap_s = rng.expovariate(rate)
        if gap_s > state_left_s:  # the state changes before the next arrival (memoryless)
            t_s += state_left_s
            bursting = not bursting
            mean_s = spec.mean_burst_s if bursting else spec.mean_calm_s
            state_left_s = rng.expovariate(1 / mean_s)
            continue
        t_s += gap_s
        state_left_s -= gap_s
        n += 1
        yield _request(rng, spec, f"{id_prefix}{n}", t_s)


def _request(rng: random.Random, spec: WorkloadSpec, request_id: str, t_s: float) -> Request:
    prompt = _lognormal_tokens(rng, spec.prompt_median_tokens, spec.prompt_sigma, 8,
                               spec.max_context_tokens - 1)
    output = _lognormal_tokens(rng, spec.output_median_tokens, spec.output_sigma, 1,
                               spec.max_context_tokens - prompt)
    return Request(request_id, t_s, prompt, output)


def take_until(stream: Iterator[Request], end_s: float) -> list[Request]:
    """The requests of ``stream`` that arrive before ``end_s`` (consumes one past it)."""
    out = []
    for req in stream:
        if req.arrival_s >= end_s:
            break
        out.append(req)
    return out
