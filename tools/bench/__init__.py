"""``vramscope bench``: every benchmark, each a ratio against a baseline measured in the same run.

These machines are shared and noisy, so an absolute figure alone proves little: each benchmark
times its subject and its baseline interleaved, in the same process, and reports medians with
their spread. One module per benchmark in this package exposes
``run(options: BenchOptions) -> list[Figure]``; ``BENCHMARKS`` maps a name to its module.
"""

from __future__ import annotations

import importlib
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

# The source checkout this tree sits in (tools/bench/ -> the root): benchmarks that start a
# Python child of ``tools`` run it from here, and read recordings from its tests/data.
CHECKOUT = Path(__file__).resolve().parents[2]

# name -> (module, what it measures). GPU benchmarks skip themselves without CUDA.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "ingest": ("tools.bench.ingest", "store write rate vs raw sqlite3.executemany"),
    "kvpool": ("tools.bench.kvpool", "KV pool allocate/free with observer off vs on"),
    "agent": ("tools.bench.agent_e2e", "replay -> socket -> database, agent CPU and RSS"),
    "limits": ("tools.bench.limits",
               "issue 45's limits: churn, chattering clients, a flood, a hostile scrape page, "
               "a hung webhook receiver"),
    "dashboard": ("tools.bench.dashboard", "every route, 15 min to 7 d, old store"),
    "detection": ("tools.bench.detection", "leak / OOM detection on the scenario suite"),
    "allocators": ("tools.bench.allocators", "one trace through three allocators"),
    "analysis": ("tools.bench.analysis", "analysis throughput vs trace reading"),
    "history": ("tools.bench.history", "analyze --db and retention on a week-old store"),
    "import": ("tools.bench.import_day",
               "import and analyze FILE of a day, 8 devices x 10 Hz, engine on vs off"),
    "fleet": ("tools.bench.fleet",
              "N real agents and their simulated servers on one PostgreSQL (--db): records "
              "lost, agent CPU and RSS, rows/s, retention lag, fleet routes; vs one node"),
    "hooks": ("tools.bench.hooks", "GPU: allocator read cost and decode overhead"),
    "vllm": ("tools.bench.vllm", "vLLM plugin cost per engine step, off vs on"),
}


@dataclass
class BenchOptions:
    quick: bool = False  # smaller sizes, for tests
    db_url: str | None = None
    rounds: int | None = None  # --rounds: overrides each benchmark's own count (>= 1)
    extra: dict[str, Any] = field(default_factory=dict)


def rounds_or(options: BenchOptions, default: int) -> int:
    """The rounds a benchmark runs: ``--rounds`` when given, else its own ``default``."""
    return options.rounds or default


@dataclass
class Figure:
    """One reported number: a value, its unit, its spread, and the target it is held to."""

    bench: str
    metric: str
    value: float
    unit: str
    spread: str = ""  # e.g. "min 1.2 / max 1.6 over 5 rounds"
    baseline: str = ""  # what the ratio is against
    target: str = ""  # e.g. ">= 100000"
    met: bool | None = None  # None: no target
    where: str = field(default_factory=lambda: describe_machine())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def describe_machine() -> str:
    try:
        import os

        cores = os.cpu_count()
    except Exception:
        cores = None
    gpu = _gpu_name()
    base = f"{platform.machine()}, {cores} cores, Python {platform.python_version()}"
    return f"{base}, {gpu}" if gpu else base


def _gpu_name() -> str | None:
    try:
        import sys

        torch = sys.modules.get("torch")  # never import torch just to name the machine
        if torch is not None and torch.cuda.is_available():
            name: str = torch.cuda.get_device_name(0)
            return name
    except Exception:
        return None
    return None


@dataclass
class Timing:
    samples_s: list[float]

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    def spread(self, scale: float = 1.0, unit: str = "s") -> str:
        lo, hi = min(self.samples_s) * scale, max(self.samples_s) * scale
        return f"min {lo:.4g} {unit} / max {hi:.4g} {unit} over {len(self.samples_s)} rounds"


def interleaved(fns: Sequence[Callable[[], Any]], rounds: int) -> list[Timing]:
    """Time each function once per round, alternating, so noise hits them alike."""
    out = [Timing([]) for _ in fns]
    for _ in range(rounds):
        for fn, timing in zip(fns, out):
            t0 = time.perf_counter()
            fn()
            timing.samples_s.append(time.perf_counter() - t0)
    return out


def create_pg_database(server: str, name: str, template: str | None = None) -> str:
    """A fresh database ``name`` on the PostgreSQL ``server`` (a URL without the database
    part), empty or a copy of ``template``; its URL. A benchmark's scratch store on the same
    server as the one measured, so a baseline differs from it only in what it holds."""
    import psycopg

    with psycopg.connect(_admin_url(server), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"'
                     + (f' TEMPLATE "{template}"' if template else ""))
    return f"{server}/{name}"


def drop_pg_database(url: str) -> None:
    """Drop the database a :func:`create_pg_database` URL names (a scratch store, once
    measured: a benchmark leaves nothing behind on a user's server)."""
    import psycopg

    server, name = url.rsplit("/", 1)
    with psycopg.connect(_admin_url(server), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def _admin_url(server: str) -> str:
    """The server's ``postgres`` database, as psycopg (not SQLAlchemy) takes its URL."""
    return server.replace("postgresql+psycopg://", "postgresql://") + "/postgres"


def load(name: str) -> ModuleType:
    if name not in BENCHMARKS:
        known = ", ".join(BENCHMARKS)
        raise KeyError(f"unknown benchmark {name!r}; known: {known}")
    return importlib.import_module(BENCHMARKS[name][0])
