"""One scrape target between scrapes: what to diff the next page against, and its records.

``agent/sources/prometheus.py``'s docstring says which records and why (increases per series,
synthetic request ids, the cap of request events a scrape); this module keeps the state those
rules need for one target, so the scraper only fetches, checks and puts.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable

from vramscope.agent.records import TOKENS_EVENT, TOKENS_EVERY_S, Event, Phase, Sample
from vramscope.agent.sources import listener
from vramscope.agent.sources.prometheus_page import (
    Preset,
    model_name,
    pool_size,
    sum_over_labels,
)

RESOLVE_EVERY_S = 30.0  # how often a local target's pid is looked up again (a restart on the port)
RATIO_SCALE = 10_000  # pool size used when a server publishes its usage ratio alone


class TargetState:
    """What one target looked like at its previous scrape: counters and gauges to diff against."""

    def __init__(self, url: str, preset: Preset, max_request_events: int = 128) -> None:
        self.url = url
        self.preset = preset
        self.max_request_events = max_request_events
        self.label = f"{preset.name}@{short_host(url)}"
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
        """Look the pid up again when due (see ``agent/sources/prometheus.py``)."""
        if not self.local:
            return
        if self.resolved_at is None or now_s - self.resolved_at >= RESOLVE_EVERY_S:
            self.resolved_at = now_s
            pid = find(self.port)
            if pid != self.pid:
                self.pid, self.noted_at = pid, None

    def records(self, samples: dict[str, list[tuple[dict[str, str], float]]], ts_s: float,
                device: int) -> list[Sample | Event]:
        """The records one scrape makes (see ``agent/sources/prometheus.py``); updates the state."""
        p = self.preset
        self.model = model_name(samples, p) or self.model
        out: list[Sample | Event] = []
        sample = self._kv_sample(samples, ts_s, device)
        if sample is not None:
            out.append(sample)
        increases = self._increases(samples)
        out += self._requests(sum_over_labels(samples, p.running),
                              sum_over_labels(samples, p.waiting),
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
        size = pool_size(samples, self.preset.kv_total)
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
        (None-free: a counter the page lacks is absent; see ``agent/sources/prometheus.py`` for the
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



def short_host(url: str) -> str:
    """``host:port`` of a URL: the target's name in its request ids."""
    return url.split("://", 1)[-1].split("/", 1)[0]

