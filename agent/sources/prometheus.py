"""Prometheus source: the KV and request view of an inference server vramscope does not enter.

``[sources.prometheus]`` names scrape targets (the servers' ``/metrics`` URLs) and a preset that
says which of their metrics mean what. Every ``interval_s`` the agent fetches each target with
``urllib`` (the text exposition format, parsed by ``prometheus_client.parser``) and maps it to
the same records the in-server hooks make, so the KV panel, the KV-exhaustion alert and the
load-aware leak analysis work beside an unmodified server:

- a ``Sample`` (``source="prometheus"``) with ``kv_blocks_used`` and ``kv_blocks_total``. vLLM
  publishes its pool size (``vllm:cache_config_info{num_gpu_blocks=...}``) and its usage ratio
  (``vllm:kv_cache_usage_perc``: blocks referenced by requests over all blocks but its null
  block; cached blocks count as free), so total = blocks - 1 and used = round(ratio × total),
  the same numbers the vLLM plugin records. SGLang publishes a token ratio and its pool
  size in tokens (``sglang:max_total_num_tokens``): its "blocks" are tokens (page size 1). Where
  no size is published, the pool is counted in ``RATIO_SCALE`` parts (used / total is still the
  usage ratio). TGI publishes no KV usage: its samples carry none.
- ``request_start`` / ``request_end`` events. Where the server counts the requests it finished
  (vLLM's ``vllm:request_success_total``, a counter), each scrape makes one ``request_end`` per
  request finished since the previous scrape (the counter's increase) and one
  ``request_start`` per request that entered the running batch (the finished ones plus the
  running gauge's rise): the request rate is vLLM's own, and the requests in flight are the
  running gauge at each scrape (what the idle-floor leak check needs). Without such a counter
  (SGLang, TGI presets) each move of the running gauge is that many starts or ends. Ids are
  ``<preset>@<target>#<n>`` (the n-th request seen; ends close the oldest open one) with
  ``data.synthetic = true`` (a counter has no request ids); at most ``max_request_events``
  a scrape: the rest follows over the next scrapes, so a scrape is never a flood of records;
- a ``server_load`` event (``running``, ``waiting``: the gauges as read) whenever either gauge
  changes;
- ``kv_preempted`` (``count``) and ``prefix_cache`` (``query_tokens``, ``hit_tokens``) events
  with the increase of the counters since the previous scrape, and ``tokens``
  (``prompt_tokens``, ``generation_tokens`` since ``since_s``) at most every
  ``TOKENS_EVERY_S`` (they are kept as long as the rollups). Increases are per series (each
  label set): the first scrape, and a series' first appearance, only set the baseline (when
  earlier increases happened is unknown); a series that went down was reset, and its new value
  is the increase (Prometheus' own ``increase()`` reads a reset so). Only the series of the
  newest page are kept (a label that changes each scrape cannot grow the state). A page
  refused whole leaves the baselines as they were: the next good scrape's increase covers the
  refused one's time.

Each target is a server process. Where the target is on this host (a sidecar: loopback,
``localhost`` or this host's name) the agent finds the pid listening on its port
(``vramscope.agent.sources.listener``: ``/proc``, at the first answer, after each recovery and
every ``RESOLVE_EVERY_S``), stamps it on the target's records and keeps its process row
(``<preset> server (port N)``, the model from the metrics' ``model_name`` label, the device), so
the Overview lists the server with its KV usage and requests per minute as it lists a server the
plugin reports. A target elsewhere gives records without a pid: the device's row shows them.

Counts and pool sizes add up over label sets (several engines behind one endpoint); the usage
ratio is their mean. Every number used is checked first (``scrape_bounds``: finite, >= 0, below
its cap): a page out of bounds is refused whole and counted in ``refused_total``. A failing
target gives no records and one log line until it answers again; nothing here raises into the
agent. Each target is scraped on its own thread (``vramscope-prometheus-<n>``) against its own
deadline: a slow server stalls neither NVML sampling nor the other targets.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vramscope.agent.clock import SYSTEM_CLOCK, Clock
from vramscope.agent.config import split_targets
from vramscope.agent.ingest.timewindow import TimeWindow
from vramscope.agent.records import TOKENS_EVENT, TOKENS_EVERY_S, Event, Phase, Sample
from vramscope.agent.sources import listener
from vramscope.agent.sources.scrape_bounds import (
    ScrapeBounds,
    ScrapeRefused,
    check_counter,
    check_pool_size,
    check_ratio,
)

log = logging.getLogger("vramscope.prometheus")

RESOLVE_EVERY_S = 30.0  # how often a local target's pid is looked up again (a restart on the port)
NOTE_EVERY_S = 5.0  # how often its process row is touched (last seen: "connected" on the Overview)
RATIO_SCALE = 10_000  # pool size used when a server publishes its usage ratio alone
MAX_BODY_BYTES = 8 * 1024 * 1024  # a /metrics page larger than this is refused, not parsed


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


def _total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str | None
           ) -> float | None:
    rows = samples.get(name) if name else None
    if not rows:
        return None
    return sum(v for _, v in rows)


def _pool_size(samples: dict[str, list[tuple[dict[str, str], float]]],
               spec: tuple[str, str | None] | None) -> int | None:
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


class TargetState:
    """What one target looked like at its previous scrape: counters and gauges to diff against."""

    def __init__(self, url: str, preset: Preset, max_request_events: int = 128) -> None:
        self.url = url
        self.preset = preset
        self.max_request_events = max_request_events
        self.label = f"{preset.name}@{_short(url)}"
        self.running = 0  # request slots open (synthetic request_start without its end)
        self.gauge = 0  # the running gauge as last read
        self.waiting: int | None = None
        # each counter series' value at the previous scrape: (name, its labels) -> value
        self.counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.started = 0  # requests started so far: the next one is #started + 1
        # prompt and generated tokens counted since ``tokens_since`` (a scrape's time), not yet
        # recorded: one ``tokens`` event every TOKENS_EVERY_S at most
        self.tokens = (0, 0)
        self.tokens_since: float | None = None
        self.backlog = (0, 0)  # starts and ends counted but not yet recorded (the cap)
        self.failing = False
        self.answered = False  # a page was taken from it since the agent started
        parts = urllib.parse.urlsplit(url)
        try:
            self.port = parts.port or (443 if parts.scheme == "https" else 80)
            self.local = listener.is_local_host(parts.hostname or "")
        except ValueError:  # not a port: the fetch fails and says so; no process to name
            self.port, self.local = 0, False
        self.pid: int | None = None  # the local process listening on the port, if found
        self.model: str | None = None  # the metrics' model_name label
        self.resolved_at: float | None = None  # when the pid was last looked up
        self.noted_at: float | None = None  # when its process row was last touched

    @property
    def process_name(self) -> str:
        return f"{self.preset.name} server (port {self.port})"

    def resolve(self, now_s: float, find: Callable[[int], int | None]) -> None:
        """Look the pid up again when due (see the module docstring)."""
        if not self.local:
            return
        if self.resolved_at is None or now_s - self.resolved_at >= RESOLVE_EVERY_S:
            self.resolved_at = now_s
            pid = find(self.port)
            if pid != self.pid:
                self.pid, self.noted_at = pid, None

    def records(self, samples: dict[str, list[tuple[dict[str, str], float]]], ts_s: float,
                device: int) -> list[Sample | Event]:
        """The records one scrape makes (see the module docstring); updates the state."""
        p = self.preset
        self.model = _model_name(samples, p) or self.model
        out: list[Sample | Event] = []
        sample = self._kv_sample(samples, ts_s, device)
        if sample is not None:
            out.append(sample)
        increases = self._increases(samples)
        out += self._requests(_total(samples, p.running), _total(samples, p.waiting),
                              increases.get(p.finished or ""), ts_s, device)
        common = {"source": "prometheus", "target": self.label}
        preempted = increases.get(p.preemptions or "", 0)
        if preempted:
            out.append(Event(ts_s, "kv_preempted", device, self.pid,
                             data={"count": preempted, **common}))
        queries = increases.get(p.prefix_queries or "", 0)
        hits = increases.get(p.prefix_hits or "", 0)
        if queries or hits:
            out.append(Event(ts_s, "prefix_cache", device, self.pid, data={
                "query_tokens": queries, "hit_tokens": hits, **common}))
        tokens = self._tokens(increases, ts_s, device)
        if tokens is not None:
            out.append(tokens)
        return out

    def _tokens(self, increases: dict[str, int], ts_s: float, device: int) -> Event | None:
        """The prompt and generated tokens counted since ``tokens_since``, once that is
        ``TOKENS_EVERY_S`` ago and they are not none (the stretch starts at the scrape before
        the first increase: the counters' baseline or the previous event)."""
        p = self.preset
        if p.prompt_tokens not in increases and p.generation_tokens not in increases:
            return None
        prompt = self.tokens[0] + increases.get(p.prompt_tokens or "", 0)
        generated = self.tokens[1] + increases.get(p.generation_tokens or "", 0)
        since = ts_s if self.tokens_since is None else self.tokens_since
        if not prompt and not generated:
            self.tokens_since = ts_s  # nothing counted yet: the stretch starts now
            return None
        if ts_s - since < TOKENS_EVERY_S:
            self.tokens, self.tokens_since = (prompt, generated), since
            return None
        self.tokens, self.tokens_since = (0, 0), ts_s
        return Event(ts_s, TOKENS_EVENT, device, self.pid, data={
            "prompt_tokens": prompt, "generation_tokens": generated, "since_s": since,
            "source": "prometheus", "target": self.label})

    def _kv_sample(self, samples: dict[str, list[tuple[dict[str, str], float]]], ts_s: float,
                   device: int) -> Sample | None:
        rows = samples.get(self.preset.kv_usage_ratio or "")
        if not rows:
            return None
        ratio = sum(v for _, v in rows) / len(rows)
        size = _pool_size(samples, self.preset.kv_total)
        pools = len(samples[self.preset.kv_total[0]]) if size and self.preset.kv_total else 0
        total = size - self.preset.reserved_blocks * pools if size else RATIO_SCALE
        ratio = min(1.0, max(0.0, ratio))
        return Sample(ts_s, device, Phase.UNKNOWN, "prometheus", self.pid,
                      kv_blocks_used=round(ratio * total), kv_blocks_total=total)

    def _requests(self, running: float | None, waiting: float | None, finished: int | None,
                  ts_s: float, device: int) -> list[Event]:
        gauge = None if running is None else int(running)
        out: list[Event] = []
        if gauge is not None:
            out = (self._slot_events(gauge, ts_s, device) if finished is None
                   else self._counted_events(finished, gauge, ts_s, device))
        queued = None if waiting is None else int(waiting)
        # on a change of either gauge only (kept as long as the rollups): requests that come
        # and go under a steady gauge are request events, not load changes
        moved = bool(out) and gauge is not None and finished is None
        if moved or (gauge is not None and gauge != self.gauge) or queued != self.waiting:
            out.append(Event(ts_s, "server_load", device, self.pid, data={
                "running": gauge, "waiting": queued, "target": self.label}))
        self.gauge = self.gauge if gauge is None else gauge
        self.waiting = queued
        return out

    def _counted_events(self, finished: int, gauge: int, ts_s: float,
                        device: int) -> list[Event]:
        """Requests from the server's own count: ``finished`` ends (the success counter's
        increase) and as many starts as make the open ones the running gauge (finished + the
        gauge's rise: a request that came and went between two scrapes is one of each). Where
        the gauge fell by more than the finished count (requests gone uncounted), no start is
        made up: the open ones follow the gauge. At most ``max_request_events`` this scrape,
        the rest kept for the next."""
        starts = max(0, finished + gauge - (self.running + self.backlog[0] - self.backlog[1]))
        ends = finished if starts else max(0, self.running + self.backlog[0]
                                           - self.backlog[1] - gauge)
        want_s, want_e = self.backlog[0] + starts, self.backlog[1] + ends
        cap = self.max_request_events
        n_starts = min(want_s, cap - min(want_e, cap // 2))
        n_ends = min(want_e, cap - n_starts, self.running + n_starts)
        self.backlog = (want_s - n_starts, want_e - n_ends)
        synthetic = {"synthetic": True, "source": "prometheus"}
        first_open = self.started - self.running + 1  # ends close the oldest open request
        out = [Event(ts_s, "request_start", device, self.pid,
                     request_id=f"{self.label}#{k}", data=synthetic)
               for k in range(self.started + 1, self.started + n_starts + 1)]
        out += [Event(ts_s, "request_end", device, self.pid,
                      request_id=f"{self.label}#{k}", data=synthetic)
                for k in range(first_open, first_open + n_ends)]
        self.started += n_starts
        self.running += n_starts - n_ends
        return out

    def _slot_events(self, gauge: int, ts_s: float, device: int) -> list[Event]:
        """request_start / request_end events moving the slots toward ``gauge`` (a server
        that publishes no count of finished requests)."""
        now = self._slots_toward(gauge)
        synthetic = {"synthetic": True, "source": "prometheus"}
        out = [Event(ts_s, "request_start", device, self.pid,
                     request_id=f"{self.label}#{k}", data=synthetic)
               for k in range(self.running + 1, now + 1)]
        out += [Event(ts_s, "request_end", device, self.pid,
                      request_id=f"{self.label}#{k}", data=synthetic)
                for k in range(self.running, now, -1)]
        self.running = now
        return out

    def _slots_toward(self, running: int) -> int:
        """The slot count after this scrape: the gauge, moved toward by at most
        ``max_request_events`` (the rest on the next scrapes; a gauge is one value)."""
        step = max(-self.max_request_events, min(self.max_request_events, running - self.running))
        return self.running + step

    def _increases(self, samples: dict[str, list[tuple[dict[str, str], float]]]
                   ) -> dict[str, int]:
        """Each published counter's increase since the previous scrape, summed over its series
        (None-free: a counter the page lacks is absent; see the module docstring for the
        first scrape and resets)."""
        out: dict[str, int] = {}
        seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for name in self.preset.counters:
            rows = samples.get(name)
            if rows is None:
                continue
            total = 0.0
            for labels, value in rows:
                key = (name, tuple(sorted(labels.items())))
                previous = self.counters.get(key)
                seen[key] = value
                if previous is not None:
                    total += value - previous if value >= previous else value
            out[name] = int(round(total))
        self.counters = seen  # this page's series only: the state is bounded by one page
        return out


class PrometheusSource:
    """Scrape ``targets`` every ``interval_s``; records go to ``put`` (the writer's put_many).

    ``run_once()`` scrapes every target once, synchronously (tests); ``start()`` gives each
    target a drift-free loop in its own named daemon thread (one target's timeouts never delay
    another's scrapes). ``fetch`` is the seam (URL -> page text), the real one is ``urllib``;
    ``find_pid`` (port -> pid) the real one ``/proc``. ``note_process`` (pid, ts_s, name, model,
    device) keeps a local target's process row (the agent's writer). ``bounds``: what one
    scrape may say (``scrape_bounds``); a page beyond them is counted in ``refused_total``.
    """

    def __init__(self, targets: Iterable[str], preset: str, put: Callable[[list[Any]], None], *,
                 interval_s: float = 1.0, timeout_s: float = 2.0, device: int = 0,
                 clock: Clock = SYSTEM_CLOCK,
                 fetch: Callable[[str, float], str] | None = None,
                 window: TimeWindow | None = None,
                 find_pid: Callable[[int], int | None] = listener.pid_listening,
                 note_process: Callable[[int, float, str, str | None, int], None] | None = None,
                 bounds: ScrapeBounds | None = None) -> None:
        if preset not in PRESETS:
            raise ValueError(f"unknown Prometheus preset {preset!r}; allowed: "
                             f"{', '.join(PRESETS)}")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.bounds = bounds or ScrapeBounds()
        self.targets = [TargetState(url, PRESETS[preset], self.bounds.max_request_events)
                        for url in targets]
        self.put = put
        self.interval_s, self.timeout_s, self.device = interval_s, timeout_s, device
        self.clock = clock
        self.fetch = fetch or fetch_url
        self.find_pid, self.note_process = find_pid, note_process
        self.scrapes_total = self.failures_total = self.refused_total = 0
        self._counts_lock = threading.Lock()  # the counters are shared by the targets' threads
        # records outside the agent's time window (a clock stepped while scraping): refused as
        # on the socket (agent/ingest/timewindow.py) and counted here
        self.window = window
        self.rejected_ts_total = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @classmethod
    def from_config(cls, config: Mapping[str, Any], put: Callable[[list[Any]], None],
                    clock: Clock = SYSTEM_CLOCK,
                    note_process: Callable[[int, float, str, str | None, int], None] | None
                    = None) -> PrometheusSource | None:
        """The source ``[sources.prometheus]`` asks for, or None when it names no target."""
        targets = split_targets(config["sources.prometheus.targets"])
        if not targets:
            return None
        return cls(targets, config["sources.prometheus.preset"], put,
                   interval_s=config["sources.prometheus.interval_s"],
                   timeout_s=config["sources.prometheus.timeout_s"],
                   device=config["sources.prometheus.device"], clock=clock,
                   window=TimeWindow.from_config(config, clock), note_process=note_process,
                   bounds=ScrapeBounds(config["sources.prometheus.max_requests"],
                                       config["sources.prometheus.max_request_events"]))

    def run_once(self) -> int:
        """Scrape every target once; returns how many records were put."""
        return sum(self.scrape_target(target) for target in self.targets)

    def scrape_target(self, target: TargetState) -> int:
        """Scrape one target and put its records; returns how many."""
        records = self._scrape(target)
        if records:
            self.put(records)
        return len(records)

    def counts(self) -> dict[str, int]:
        """For ``vramscope status``: scrapes, those that failed, those refused (in failures),
        and the targets answering now (each a server the agent hears from: a client)."""
        with self._counts_lock:
            return {"scrapes_total": self.scrapes_total, "failures_total": self.failures_total,
                    "refused_total": self.refused_total,
                    "targets_answering": sum(1 for t in self.targets
                                             if t.answered and not t.failing)}

    def _count(self, name: str, n: int = 1) -> None:
        with self._counts_lock:
            setattr(self, name, getattr(self, name) + n)

    def _scrape(self, target: TargetState) -> list[Sample | Event]:
        self._count("scrapes_total")
        try:
            asked_s = self.clock.time_s()
            page = self.fetch(target.url, self.timeout_s)
            # the scrape's time: the middle of the fetch, during which the server made the
            # page, not after the parse (a busy page takes milliseconds to parse, in which a
            # busy pool moves on): the records say what the server said then
            now_s = (asked_s + self.clock.time_s()) / 2
            samples = parse_exposition(page)
            check_page(samples, target.preset, self.bounds)
            if target.failing:  # back after a gap: maybe a restart on the port, a new pid
                target.resolved_at = None
            target.resolve(now_s, self.find_pid)
            records = target.records(samples, now_s, self.device)
            self.bounds.check_records(len(records))
            self._note(target, now_s)
        except Exception as exc:  # noqa: BLE001 - a bad target must not stop the agent
            self._count("failures_total")
            if isinstance(exc, ScrapeRefused):
                self._count("refused_total")
            if not target.failing:
                target.failing = True
                log.warning("Prometheus target %s: %s; no KV or request records from it until "
                            "it answers (sources.prometheus.targets)", target.url, _why(exc))
            return []
        target.answered = True
        if target.failing:
            target.failing = False
            log.info("Prometheus target %s answers again", target.url)
        if self.window is not None:
            kept, refused = self.window.keep(records)
            if refused is not None:
                self._count("rejected_ts_total", refused.records)
                log.warning("Prometheus target %s: %s", target.url, self.window.describe(refused))
                records = list(kept)
        return records

    def _note(self, target: TargetState, now_s: float) -> None:
        """Keep a local target's process row (named, its model, last seen) every
        ``NOTE_EVERY_S``, and at once when its pid changed."""
        if self.note_process is None or target.pid is None:
            return
        if target.noted_at is None or now_s - target.noted_at >= NOTE_EVERY_S:
            target.noted_at = now_s
            self.note_process(target.pid, now_s, target.process_name, target.model, self.device)

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._loop, args=(target,), daemon=True,
                                          name=f"vramscope-prometheus-{n}")
                         for n, target in enumerate(self.targets)]
        for thread in self._threads:
            thread.start()
        log.info("scraping %d Prometheus target(s) every %g s (preset %s)", len(self.targets),
                 self.interval_s, self.targets[0].preset.name)

    def stop(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + self.timeout_s + 5
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _loop(self, target: TargetState) -> None:
        next_s = time.monotonic()
        while not self._stop.is_set():
            self.scrape_target(target)
            next_s += self.interval_s
            now = time.monotonic()
            if next_s < now:  # late by more than an interval: skip, don't burst
                next_s = now
            self._stop.wait(next_s - now)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A scrape target is the URL configured: a redirect is an error that names where it
    pointed (each hop would cost another timeout, and could lead anywhere)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl} not followed; "
                                     "name the final URL in sources.prometheus.targets",
                                     headers, fp)


_OPENER = urllib.request.build_opener(_NoRedirects())
_CHUNK_BYTES = 65_536


def fetch_url(url: str, timeout_s: float) -> str:
    """GET ``url`` as text within ``timeout_s`` in all (a server trickling its page a byte at
    a time never waits out a per-read timeout); raises on HTTP errors, redirects, timeouts and
    pages over ``MAX_BODY_BYTES``."""
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    chunks: list[bytes] = []
    size = 0
    with _OPENER.open(request, timeout=timeout_s) as response:
        while size <= MAX_BODY_BYTES:
            if time.monotonic() > deadline:
                raise TimeoutError(f"page not complete after {timeout_s:g} s "
                                   "(sources.prometheus.timeout_s)")
            chunk: bytes = response.read1(_CHUNK_BYTES)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    if size > MAX_BODY_BYTES:
        raise ValueError(f"page larger than {MAX_BODY_BYTES} bytes")
    return b"".join(chunks).decode("utf-8", errors="replace")


def _model_name(samples: dict[str, list[tuple[dict[str, str], float]]],
                preset: Preset) -> str | None:
    """The served model's name: the ``model_name`` label of the preset's own metrics (vLLM and
    SGLang label every one of theirs with it)."""
    for name in (preset.kv_usage_ratio, preset.running, preset.waiting):
        for labels, _ in samples.get(name or "", ()):
            if labels.get("model_name"):
                return labels["model_name"][:255]
    return None


def _short(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0]


def _why(exc: Exception) -> str:
    if isinstance(exc, ScrapeRefused):
        return f"page refused: {exc}"
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}" + (f" ({exc.msg})" if 300 <= exc.code < 400 else "")
    if isinstance(exc, urllib.error.URLError):
        return f"cannot connect ({exc.reason})"
    return f"{type(exc).__name__}: {exc}"
