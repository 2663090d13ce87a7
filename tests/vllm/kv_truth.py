"""vLLM's own KV usage of every engine step, for the agreement test (issue 47): a test-only
``vllm.general_plugins`` entry point that records what ``vllm:kv_cache_usage_perc`` is set from.

vLLM's scheduler makes a ``SchedulerStats`` at the end of each step
(``Scheduler.make_stats``, in ``update_from_output``); the API server sets the
``vllm:kv_cache_usage_perc`` gauge from its ``kv_cache_usage`` some milliseconds later
(``vllm/v1/metrics/loggers.py``), so a value that lasted one step may be on ``/metrics`` too
briefly for any reader to see it. This wraps ``make_stats`` and appends ``<time.time()>
<kv_cache_usage>`` to ``$VRAMSCOPE_TEST_KV_TRUTH`` per stats made: vLLM's value at each moment,
independent of vramscope's plugin (which wraps other methods). Unset: nothing is patched.

:func:`plugin_path` makes the folder whose ``.dist-info`` names the entry point: on
``PYTHONPATH``, vLLM's plugin loader finds it (every general plugin loads while ``VLLM_PLUGINS``
is unset).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

ENV = "VRAMSCOPE_TEST_KV_TRUTH"
_patched = False


def register() -> None:
    global _patched
    path = os.environ.get(ENV)
    if not path or _patched:
        return
    from vllm.v1.core.sched.scheduler import Scheduler

    _patched = True
    original = Scheduler.make_stats
    out = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open while it runs

    def make_stats(self: Any, *args: Any, **kwargs: Any) -> Any:
        stats = original(self, *args, **kwargs)
        if stats is not None:
            out.write(f"{time.time()!r} {stats.kv_cache_usage!r}\n")
        return stats

    Scheduler.make_stats = make_stats  # type: ignore[method-assign]


def plugin_path(root: Path) -> Path:
    """A folder that, on ``PYTHONPATH``, makes vLLM load :func:`register`."""
    info = root / "vramscope_kv_truth-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vramscope-kv-truth\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nkv_truth = tests.vllm.kv_truth:register\n")
    return root


def read(path: Path) -> list[tuple[float, float]]:
    """The recorded (time, usage) pairs, in time order."""
    pairs = []
    for line in path.read_text().splitlines():
        ts, usage = line.split()
        pairs.append((float(ts), float(usage)))
    return sorted(pairs)
