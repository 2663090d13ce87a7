"""What a ``/metrics`` page says: the presets naming its metrics, its parse, its bounds check.

Pure functions of a page's text or of its parsed samples (sample name -> [(labels, value)]), apart
from the scraper (``agent/sources/prometheus.py``) and the per-target state that turns samples
into records (``agent/sources/prometheus_target.py``), so each reading is tested on a page.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramscope.agent.sources.scrape_bounds import (
    ScrapeBounds,
    check_counter,
    check_pool_size,
    check_ratio,
)


@dataclass(frozen=True)
class Preset:
    """Which sample names of one server mean what. ``None``: the server has no such metric."""

    name: str
    kv_usage_ratio: str | None  # gauge in [0, 1]
    kv_total: tuple[str, str | None] | None  # (sample name, label holding it, or None: value)
    running: str | None
    waiting: str | None
    prefix_queries: str | None  # counter, tokens
    prefix_hits: str | None  # counter, tokens
    preemptions: str | None  # counter
    reserved_blocks: int = 0  # blocks of the published pool size that are never usable
    finished: str | None = None  # counter of requests finished (every reason)
    prompt_tokens: str | None = None  # counter
    generation_tokens: str | None = None  # counter

    @property
    def counters(self) -> tuple[str, ...]:
        """Every counter of the preset that the server publishes under this name."""
        return tuple(c for c in (self.prefix_queries, self.prefix_hits, self.preemptions,
                                 self.finished, self.prompt_tokens, self.generation_tokens)
                     if c is not None)


# Read in vLLM 0.32's ``vllm/v1/metrics/loggers.py``, SGLang's ``srt/metrics/collector.py`` and
# production-metrics page, TGI's metrics reference.
PRESETS: dict[str, Preset] = {
    "vllm": Preset("vllm", "vllm:kv_cache_usage_perc", ("vllm:cache_config_info", "num_gpu_blocks"),
                   "vllm:num_requests_running", "vllm:num_requests_waiting",
                   "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                   "vllm:num_preemptions_total", reserved_blocks=1,  # vLLM's null block
                   finished="vllm:request_success_total",  # labelled by finished_reason
                   prompt_tokens="vllm:prompt_tokens_total",
                   generation_tokens="vllm:generation_tokens_total"),
    "sglang": Preset("sglang", "sglang:token_usage", ("sglang:max_total_num_tokens", None),
                     "sglang:num_running_reqs", "sglang:num_queue_reqs", None,
                     "sglang:cached_tokens_total", None),
    "tgi": Preset("tgi", None, None, "tgi_batch_current_size", "tgi_queue_size", None, None,
                  None),
}


def parse_exposition(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of a text exposition; ValueError on a malformed page,
    naming its first bad line (number and text): the parser's own message names neither."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except ValueError as exc:
        raise ValueError(_bad_line(text) or f"malformed page ({exc})") from exc
    return out


def _bad_line(text: str) -> str | None:
    """Which line of a page the parser refuses, parsed one at a time (only on a bad page)."""
    from prometheus_client.parser import text_string_to_metric_families

    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            for _ in text_string_to_metric_families(line + "\n"):
                pass
        except ValueError as exc:
            shown = line if len(line) <= 200 else line[:199] + "…"
            return f"line {number} is not a sample ({exc}): {shown!r}"
    return None


def check_page(samples: dict[str, list[tuple[dict[str, str], float]]], preset: Preset,
               bounds: ScrapeBounds) -> None:
    """Raise :class:`ScrapeRefused` naming the first number of the page out of its bounds."""
    bounds.check_requests(preset.running, samples)
    bounds.check_requests(preset.waiting, samples)
    check_ratio(preset.kv_usage_ratio, samples)
    if preset.kv_total is not None:
        check_pool_size(*preset.kv_total, samples)
    for counter in preset.counters:
        check_counter(counter, samples)


def sum_over_labels(samples: dict[str, list[tuple[dict[str, str], float]]],
                    name: str | None) -> float | None:
    """A gauge summed over its label sets (several engines behind one endpoint); None: absent."""
    rows = samples.get(name) if name else None
    if not rows:
        return None
    return sum(v for _, v in rows)


def pool_size(samples: dict[str, list[tuple[dict[str, str], float]]],
              spec: tuple[str, str | None] | None) -> int | None:
    """The published pool size, summed over label sets; None: absent, zero or not a number."""
    if spec is None or spec[0] not in samples:
        return None
    name, label = spec
    total = 0
    for labels, value in samples[name]:
        raw = labels.get(label) if label else value
        try:
            total += int(float(raw))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
    return total or None



def model_name(samples: dict[str, list[tuple[dict[str, str], float]]],
                preset: Preset) -> str | None:
    """The served model's name: the ``model_name`` label of the preset's own metrics (vLLM and
    SGLang label every one of theirs with it)."""
    for name in (preset.kv_usage_ratio, preset.running, preset.waiting):
        for labels, _ in samples.get(name or "", ()):
            if labels.get("model_name"):
                return labels["model_name"][:255]
    return None

