"""Who this server process is in a distributed job: its rank, local rank and world size.

From ``torch.distributed`` once initialized, else from the launchers' variables (docs/agent.md,
"Ranks"), so a leak or an OOM risk on one rank says which. :class:`RankWatch` is a sampler task
that sends ``process_rank`` when the rank is known and again only if it changes. Never raises.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any, NamedTuple

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.records import INT32_MAX, RANK_EVENT, Event

MAX_RANK = INT32_MAX  # the processes table's Integer columns
_ENV: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("rank", ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")),
    ("local_rank", ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                    "SLURM_LOCALID")),
    ("world_size", ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")),
)


class RankInfo(NamedTuple):
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None


def _int(text: Any) -> int | None:
    try:
        value = int(str(text).strip())
    except (TypeError, ValueError):
        return None
    return value if 0 <= value <= MAX_RANK else None


def rank_from_env(environ: Mapping[str, str] | None = None) -> RankInfo:
    """The first variable of each kind that holds an integer; a bad value is skipped."""
    env = os.environ if environ is None else environ
    found = {}
    for field, names in _ENV:
        found[field] = next((v for v in (_int(env.get(n)) for n in names) if v is not None),
                            None)
    return RankInfo(**found)


def rank_from_torch(torch: ModuleType, environ: Mapping[str, str] | None = None) -> RankInfo | None:
    """``torch.distributed``'s rank and world size (local rank from the environment), or
    ``None`` while it is not initialized."""
    try:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return None
        return RankInfo(_int(dist.get_rank()), rank_from_env(environ).local_rank,
                        _int(dist.get_world_size()))
    except Exception:  # noqa: BLE001 - a half-initialized group must not reach the server
        return None


class RankWatch:
    """Sampler task: one ``process_rank`` event when the rank is known or changes."""

    def __init__(self, torch: ModuleType, *, clock: Clock = SYSTEM_CLOCK, pid: int | None = None,
                 environ: Mapping[str, str] | None = None, interval_s: float = 5.0) -> None:
        self._torch = torch
        self._clock = clock
        self._pid = os.getpid() if pid is None else pid
        self._environ = environ
        self.interval_s = interval_s
        self._sent: RankInfo | None = None

    def read(self) -> Event | None:
        from_torch = rank_from_torch(self._torch, self._environ) if self._torch else None
        info = from_torch or rank_from_env(self._environ)
        if from_torch is not None:
            self.interval_s = max(self.interval_s, 60.0)  # settled: look rarely
        if info.rank is None or info == self._sent:
            return None
        self._sent = info
        return Event(self._clock.time_s(), RANK_EVENT, 0, self._pid, None, None,
                     {k: v for k, v in info._asdict().items() if v is not None})
