"""The settings table: every setting's key, type, default, range, help and check, in one place.

``SETTINGS`` (as ``SETTINGS`` in ``datasette/app.py``) drives the defaults, the validation in
``config.py`` and the docs: ``tests/test_docs.py`` fails when a setting is missing from
``docs/configuration.md``. The checks a setting names (an IP address, URLs, uids, a dtype, a
database URL) and the defaults that depend on the environment (the XDG folders) live beside
it. Part of the core the hooks import (``install()`` reads the same table as the agent), so it
imports nothing above the core.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramscope.agent.database_url import database_url_problem
from vramscope.agent.dtypes import element_bytes, known_dtypes


@dataclass(frozen=True)
class Setting:
    key: str  # "section.name"
    type: type  # int, float, str or bool
    default: Any
    help: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] | None = None
    check: Callable[[Any], str | None] | None = None  # returns a problem, or None


def data_dir() -> Path:
    """Where vramscope keeps its files by default (the default database, the demo's)."""
    home = os.path.expanduser("~")
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    return Path(base) / "vramscope"


def _runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join("/tmp", f"vramscope-{os.getuid()}")
    return Path(base) / "vramscope"


def default_database_url() -> str:
    return f"sqlite:///{data_dir() / 'vramscope.db'}"


def default_socket_path() -> str:
    return str(_runtime_dir() / "agent.sock")


def _ip_check(value: str) -> str | None:
    import ipaddress

    try:
        ipaddress.ip_address(value)
    except ValueError:
        return "expected an IP address such as 127.0.0.1, 0.0.0.0 or ::1"
    return None


def split_targets(text: str) -> list[str]:
    """``sources.prometheus.targets`` as a list of URLs."""
    return [t.strip() for t in text.split(",") if t.strip()]


def _targets_check(value: str) -> str | None:
    # here, not in sources.prometheus: config is part of the core the hooks import, and the core
    # imports nothing above it (docs/architecture.md, "Direction of imports")
    for target in split_targets(value):
        if not target.startswith(("http://", "https://")):
            return (f"{target!r} is not an http(s) URL; expected comma-separated URLs such as "
                    f"http://127.0.0.1:8000/metrics")
    return None


def parse_uids(text: str) -> list[int]:
    """``agent.allowed_uids`` as uids (the value passed :func:`_uids_check`)."""
    return [int(part) for part in (p.strip() for p in text.split(",")) if part]


def _uids_check(value: str) -> str | None:
    bad = [part for part in (p.strip() for p in value.split(",")) if part and not part.isdigit()]
    if not bad:
        return None
    which = ", ".join(repr(b) for b in bad)
    return (f"{which} {'is not a uid' if len(bad) == 1 else 'are not uids'} (expected numbers "
            f"separated by commas)")


def _dtype_check(value: str) -> str | None:
    # vLLM's --kv-cache-dtype names its fp8 formats fp8_e4m3, fp8_e5m2: one byte each
    if value == "auto" or value.startswith("fp8") or element_bytes(value) is not None:
        return None
    return f"unknown dtype; expected auto or one of {known_dtypes()}"


# SQLite's quick_check reads every page: its cost grows with the file, so a fixed interval would
# cost a week-old store many times what it costs a young one. Checks are spaced by their own
# measured CPU time so that they take at most this share of a core (store.integrity_wait_s):
# the larger the store, the further apart.
INTEGRITY_MAX_CPU_PERCENT = 0.25

# One row per setting. Defaults that depend on the environment are callables.
SETTINGS: tuple[Setting, ...] = (
    # --- database -----------------------------------------------------------------------
    Setting("database.url", str, default_database_url,
            "SQLAlchemy URL of the store. Default: SQLite under the user's data directory "
            "(`$XDG_DATA_HOME/vramscope/vramscope.db`).", check=database_url_problem),
    Setting("database.synchronous", str, "NORMAL",
            "SQLite `synchronous` pragma: NORMAL (WAL-safe, may lose the last commits on power "
            "loss) or FULL.", choices=("NORMAL", "FULL")),
    Setting("database.integrity_check_interval_s", float, 900.0,
            "The agent runs SQLite's `PRAGMA quick_check` this often (reads the whole file once; "
            "the result is in `vramscope status`, /healthz and the log); 0 disables.", min=0,
            max=7 * 86400),
    Setting("database.integrity_check_max_cpu_percent", float, INTEGRITY_MAX_CPU_PERCENT,
            "The integrity check's cost grows with the file (seconds of CPU per GB): checks are "
            "spaced further apart than `integrity_check_interval_s` when needed to take at "
            "most this share of one core (a week-old store at 8 x 10 Hz, 4-9 CPU-s a check: "
            "every 25-60 minutes).",
            min=0.01, max=100),
    # --- sampling -----------------------------------------------------------------------
    Setting("sampling.device_interval_s", float, 0.1,
            "NVML device memory sampling interval (default 10 Hz).", min=0.001, max=3600),
    Setting("sampling.process_interval_s", float, 1.0,
            "NVML per-process sampling interval.", min=0.01, max=3600),
    Setting("sampling.allocator_interval_s", float, 0.1,
            "In-server caching-allocator counter reads.", min=0.001, max=3600),
    Setting("sampling.snapshot_interval_s", float, 60.0,
            "In-server allocator snapshots for fragmentation (largest free block); 0 disables.",
            min=0, max=86400),
    Setting("sampling.snapshot_max_cost_s", float, 0.05,
            "Skip and space out snapshots once one costs more than this.", min=0, max=60),
    Setting("sampling.kv_interval_s", float, 0.1,
            "KV pool counter reads of the vLLM plugin while the pool is busy and unchanged (a "
            "change is sampled at the engine step it happens in; see [vllm.md](vllm.md)).",
            min=0.001, max=3600),
    Setting("sampling.kv_min_interval_s", float, 0.001,
            "The vLLM plugin samples its KV pool at each engine step that changed it, but "
            "never twice within this: the bound on those samples' rate and storage (about "
            "124 B each, raw); longer trades agreement with vLLM's `/metrics` for fewer rows.",
            min=0.001, max=3600),
    # --- sources.prometheus: a server's /metrics beside it (agent/sources/prometheus.py) --
    Setting("sources.prometheus.targets", str, "",
            "Comma-separated /metrics URLs of inference servers to scrape for KV usage and "
            "request counts (e.g. `http://127.0.0.1:8000/metrics`); empty: off. See "
            "[vllm.md](vllm.md).", check=_targets_check),
    Setting("sources.prometheus.preset", str, "vllm",
            "Which metric names the targets publish.", choices=("vllm", "sglang", "tgi")),
    Setting("sources.prometheus.interval_s", float, 1.0, "Scrape interval.", min=0.05,
            max=3600),
    Setting("sources.prometheus.timeout_s", float, 2.0, "Timeout of one scrape.", min=0.05,
            max=60),
    Setting("sources.prometheus.device", int, 0,
            "Device index the scraped KV samples and request events are recorded under.",
            min=0, max=1023),
    Setting("sources.prometheus.max_requests", int, 1_000_000,
            "A scraped running or waiting gauge above this (or negative, or not finite) "
            "refuses the whole scrape: a broken or hostile page. See [agent.md](agent.md).",
            min=1, max=100_000_000),
    Setting("sources.prometheus.max_request_events", int, 128,
            "Synthetic request events one scrape makes at most; more requests started or "
            "finished (vLLM's success counter, or a move of the running gauge) follow over the "
            "next scrapes.", min=1, max=100_000),
    # --- hooks (in-server) --------------------------------------------------------------
    Setting("hooks.history", str, "off",
            "Allocation history for post-mortems: off, alloc (no stacks), python, all. "
            "Costs about +35 % per allocation with python stacks.",
            choices=("off", "alloc", "python", "all")),
    Setting("hooks.history_max_entries", int, 20000,
            "Bound on recorded allocation history entries.", min=1, max=10_000_000),
    Setting("hooks.snapshot_dir", str, "",
            "Where OOM post-mortems keep the PyTorch snapshot pickle; empty keeps none."),
    Setting("hooks.postmortem_min_interval_s", float, 60.0,
            "At most one post-mortem per process in this time.", min=0, max=86400),
    Setting("hooks.buffer_records", int, 10000,
            "Hook client buffer bound; older records are dropped and counted.", min=10,
            max=10_000_000),
    # --- agent --------------------------------------------------------------------------
    Setting("agent.socket_path", str, default_socket_path,
            "Unix socket the agent listens on (its directory is created with mode 0700)."),
    Setting("agent.allowed_uids", str, "",
            "Comma-separated uids allowed to connect besides the agent's own.",
            check=_uids_check),
    Setting("agent.handshake_timeout_s", float, 5.0,
            "A new connection must send its hello (or status request) within this.",
            min=0.1, max=3600),
    Setting("agent.idle_timeout_s", float, 60.0,
            "A message once started must be complete within this (a slowloris is closed).",
            min=0.1, max=86400),
    Setting("agent.max_record_age_s", float, 0.0,
            "Records timed more than this before the agent's clock are refused at ingest "
            "(counted as rejected 'ts'); 0: retention.raw_s. `vramscope import` keeps a trace's "
            "own times.", min=0, max=100 * 365 * 86400.0),
    Setting("agent.max_record_ahead_s", float, 300.0,
            "Records timed more than this after the agent's clock are refused at ingest "
            "(counted as rejected 'ts').", min=1, max=365 * 86400.0),
    Setting("agent.max_hosts", int, 8,
            "Live host names clients may keep (besides the agent's own); a record naming one "
            "more is refused (rejected 'names'). One client: at most 2 it created; one agent "
            "run: at most 4x this many distinct ones.", min=1, max=100_000),
    Setting("agent.max_devices", int, 32,
            "Live devices (host, index) clients may keep; a record naming one more is refused "
            "(rejected 'names'). One client: at most 16 it created; one agent run: at most 4x "
            "this many distinct ones. The dashboard's cost grows with the devices: /metrics "
            "and the Overview read each live device's newest state.", min=1, max=100_000),
    Setting("agent.max_processes", int, 256,
            "Live processes (host, pid) clients may send records for; a record naming one more "
            "is refused (rejected 'names'). One client: at most 64 it created.",
            min=1, max=1_000_000),
    Setting("agent.name_idle_s", float, 300.0,
            "A host, device or process no open connection sent for this long (or whose "
            "connections all closed) is no longer live and frees its slot under "
            "agent.max_hosts, agent.max_devices and agent.max_processes.", min=1,
            max=7 * 86400.0),
    Setting("agent.slot_idle_s", float, 120.0,
            "When every client slot (256) is taken, a client that had no record kept for this "
            "long, or none within agent.handshake_timeout_s of its hello, gives its slot to a "
            "new client (rejected 'idle' or 'chatter').", min=1, max=86400.0),
    Setting("agent.client_max_rows_per_s", float, 10_000.0,
            "Records per second one client process (its connections together) may write; "
            "beyond, they are refused "
            "(rejected 'budget_rows'). Bursts of agent.client_budget_burst_s.", min=1,
            max=10_000_000.0),
    Setting("agent.client_max_bytes_per_s", float, 2_097_152.0,
            "Bytes of records (their JSON on the wire) per second one client may write; "
            "beyond, they are refused (rejected 'budget_bytes'). 2 MiB/s is about 170 GB a "
            "day.", min=1024, max=10 * 2**30),
    Setting("agent.client_budget_burst_s", float, 10.0,
            "A client may write this many seconds of its rows and bytes budget at once (a "
            "post-mortem, a flush after a reconnect).", min=0.1, max=3600.0),
    Setting("agent.client_max_rare_events_per_day", int, 200_000,
            "Events kept with the rollups (the kept class of agent/event_kinds.py: OOMs, "
            "orphaned blocks, preemptions, layouts; kept retention.rollup_s; names it does not "
            "list go with the raw samples and are not counted) and "
            "post-mortems one client process may have stored per UTC day; beyond, they are "
            "refused (rejected "
            "'rare_events_day'), its samples and frequent events still stored. A server "
            "with one such event a second all day has 86,400; the cap bounds what one client "
            "adds to the rollups' days.", min=1, max=1_000_000_000),
    Setting("agent.max_message_bytes", int, 1_048_576,
            "Largest accepted ingest message.", min=1024, max=64 * 1_048_576),
    Setting("agent.queue_max_records", int, 100_000,
            "Bound of the writer queue; when full the oldest records are dropped and counted.",
            min=100, max=100_000_000),
    Setting("agent.batch_rows", int, 2000, "Writer commits after this many rows...", min=1,
            max=1_000_000),
    Setting("agent.batch_interval_s", float, 0.5, "...or after this long, whichever first.",
            min=0.01, max=60),
    Setting("agent.metrics_port", int, 0,
            "Port for the agent's own Prometheus /metrics; 0 disables.", min=0, max=65535),
    Setting("agent.metrics_host", str, "127.0.0.1",
            "Address the agent's /metrics binds to: 127.0.0.1 keeps it on this host; in a "
            "Kubernetes pod, 0.0.0.0 lets Prometheus scrape the pod's IP (the counters are "
            "health figures, no memory data).", check=_ip_check),
    Setting("agent.host_name", str, "", "Host name recorded in the store; empty uses the "
            "machine's hostname."),
    # --- retention ----------------------------------------------------------------------
    Setting("retention.raw_s", float, 86400.0,
            "Keep raw samples (and cheap events: requests, KV block moves, phase changes, names "
            "agent/event_kinds.py does not list) this long.", min=60, max=10 * 365 * 86400),
    Setting("retention.compact_after_s", float, 600.0,
            "Move raw samples this old (and rolled up) from one row each into the compact raw "
            "tier: per device, source, pid and ten minutes, one block of compressed columns "
            "(about a tenth of the size); the interval's frequent events too, per device and "
            "pid. Reads are unchanged.", min=0, max=10 * 365 * 86400),
    Setting("retention.second_s", float, 14 * 86400.0,
            "Keep the per-second tier (min, max, last of every counter and the phase, per "
            "second) this long.", min=60, max=10 * 365 * 86400),
    Setting("retention.rollup_s", float, 90 * 86400.0,
            "Keep per-minute rollups (min, max, mean, last) and kept events (OOMs, orphaned KV "
            "blocks, preemptions: agent/event_kinds.py) this long.", min=60,
            max=10 * 365 * 86400),
    Setting("retention.step_rows", int, 5000,
            "Rows deleted per retention step (small steps never stall ingest).", min=10,
            max=1_000_000),
    # --- dashboard ----------------------------------------------------------------------
    Setting("dashboard.host", str, "127.0.0.1",
            "Bind address. Anything but loopback requires `dashboard.token`."),
    Setting("dashboard.port", int, 8321, "Dashboard port.", min=1, max=65535),
    Setting("dashboard.token", str, "",
            "Bearer token required on every request when set (compared in constant time)."),
    Setting("dashboard.refresh_s", float, 5.0, "Live refresh interval of pages.", min=0.5,
            max=3600),
    # --- server: the inference server's model and admission limits (alerts/config_check.py) -
    Setting("server.model", str, "",
            "The model the inference server runs, as vLLM's `--model` names it: its Hugging "
            "Face `config.json`, the model folder that holds it, or a model id "
            "(`org/name`) in the local Hugging Face cache. Set, the agent checks at start-up "
            "and on the OOM risk page that the worst request the server admits fits under "
            "each device's limit (alert `config_oom`); empty: no check. See "
            "[estimate.md](estimate.md#the-oom-a-configuration-makes-possible)."),
    Setting("server.max_model_len", int, 0,
            "Longest sequence admitted, in tokens (vLLM's `--max-model-len`); 0: the model's "
            "`max_position_embeddings`, as vLLM does.", min=0, max=100_000_000),
    Setting("server.max_num_seqs", int, 0,
            "Sequences admitted at once (vLLM's `--max-num-seqs`); required with "
            "`server.model`.", min=0, max=10_000_000),
    Setting("server.max_num_batched_tokens", int, 0,
            "Tokens one forward may take (vLLM's `--max-num-batched-tokens`, chunked "
            "prefill); 0: no limit, every admitted sequence's whole prompt in one forward.",
            min=0, max=1_000_000_000),
    Setting("server.kv_pool_gib", float, 0.0,
            "A preallocated KV pool, GiB (vLLM logs it at start-up as \"Available KV cache "
            "memory\"); 0: the KV cache grows with the requests (max_num_seqs × max_model_len "
            "tokens).", min=0, max=1_000_000),
    Setting("server.dtype", str, "auto",
            "Weights' and activations' dtype (vLLM's `--dtype`); auto: the config's "
            "`torch_dtype`.", check=_dtype_check),
    Setting("server.weight_dtype", str, "auto",
            "Stored weight dtype when quantized (`int4` for AWQ/GPTQ, `fp8`); auto: "
            "`server.dtype`.", check=_dtype_check),
    Setting("server.kv_cache_dtype", str, "auto",
            "KV cache dtype (vLLM's `--kv-cache-dtype`: `fp8`...); auto: `server.dtype`.",
            check=_dtype_check),
    Setting("server.overhead_gib", float, 1.0,
            "CUDA context, cuBLAS/NCCL workspaces and allocator slack, GiB (the estimator's "
            "allowance).", min=0, max=1_000_000),
    # --- alerts (built-in rule thresholds; user rules are [[alerts.rules]]) ---------------
    Setting("alerts.headroom_warning_ratio", float, 0.05,
            "Warn when free memory under the limit, after the largest prefill spike, is below "
            "this share of the limit. (Not 0.10: a server that preallocates 90 % for its KV "
            "pool, vLLM's default, is healthy while steady.)", min=0, max=1),
    Setting("alerts.headroom_critical_ratio", float, 0.02,
            "Critical below this share.", min=0, max=1),
    Setting("alerts.time_to_oom_warning_s", float, 1800.0,
            "Warn when the forecast time to OOM is below this.", min=0, max=30 * 86400),
    Setting("alerts.time_to_oom_critical_s", float, 300.0,
            "Critical when the forecast time to OOM is below this.", min=0, max=30 * 86400),
    Setting("alerts.leak_min_slope_ratio_per_h", float, 0.0025,
            "Smallest idle-floor growth, as a share of the limit per hour, reported as a leak.",
            min=0, max=1),
    Setting("alerts.leak_warmup_s", float, 300.0,
            "Warm-up: the first seconds of a process (and after a model reload) are not its "
            "idle floor (weights, allocator caches and workspaces settle within a minute on "
            "the servers recorded on an H200; a lazy warm-up that grows for longer is told "
            "from a leak by the trend's checks: docs/analysis.md); the OOM trend waits at "
            "most 5 minutes of it.",
            min=0, max=86400),
    Setting("alerts.leak_floor_window_s", float, 60.0,
            "Longest idle-floor window: the window is one cycle of the server (idle entries, "
            "request ends or prefill entries; at least 4 samples), at most this long. It says "
            "where a floor point is read, not when a verdict is due.",
            min=0.01, max=86400),
    Setting("alerts.leak_horizon_s", float, 7200.0,
            "The leak trend is fitted on the idle floor of this long (one trend point per 1/120 "
            "of it).", min=60, max=30 * 86400),
    Setting("alerts.leak_min_span_s", float, 900.0,
            "Idle floor after the warm-up a leak verdict needs (four times this, at most 0.9 "
            "of leak_horizon_s, where the floor is mostly an estimate: never idle, no KV "
            "figures; less, down to this, where its slope adds 4 % of the limit sooner); "
            "before it the answer is insufficient_data (with what is missing), never "
            "no_leak and never an alert.",
            min=60, max=30 * 86400),
    Setting("alerts.trend_window_s", float, 60.0,
            "Longest OOM-trend window: two cycles of the server (at least 8 samples), at most "
            "this long; the peak of each window feeds the forecast.",
            min=0.01, max=86400),
    Setting("alerts.trend_span_s", float, 1200.0,
            "The OOM forecast's trend is fitted on the peaks of this long (20 points); a "
            "forecast reaches at most 3 times the span it was fitted on.",
            min=60, max=30 * 86400),
    Setting("alerts.trend_min_span_s", float, 600.0,
            "Peaks after the warm-up the OOM forecast's slow route needs before it says "
            "anything (a steep rise is forecast sooner by the fast route, on evidence that "
            "scales with it).",
            min=30, max=30 * 86400),
    Setting("alerts.fragmentation_warning_ratio", float, 0.5,
            "Warn when external fragmentation exceeds this while headroom is low.", min=0,
            max=1),
    Setting("alerts.kv_exhaustion_warning_s", float, 60.0,
            "Warn when the KV pool's free plus cached blocks run out within this.", min=0,
            max=86400),
    Setting("alerts.kv_exhaustion_min_usage_ratio", float, 0.8,
            "The KV exhaustion alert fires only while this share of the pool's blocks is used, "
            "and stays until usage is below it again (a burst in a roomy pool is not "
            "exhaustion).", min=0, max=1),
    Setting("alerts.risk_for_s", float, 15.0,
            "The OOM-risk warning fires once the risk has stayed at warning this long (at "
            "once when critical). Shorten only for short recordings.", min=0, max=86400),
    Setting("alerts.webhook_url", str, "", "POST alerts to this URL (JSON body); empty: off."),
    Setting("alerts.webhook_timeout_s", float, 5.0, "Webhook request timeout.", min=0.1,
            max=120),
    Setting("alerts.webhook_retries", int, 3, "Webhook retries with backoff.", min=0, max=20),
    Setting("alerts.webhook_queue_max", int, 1000,
            "Alerts waiting for the webhook at most (each its newest state); beyond it the "
            "oldest of the least severe is dropped. Critical alerts are never dropped.",
            min=1, max=100_000),
    Setting("alerts.webhook_max_per_alert_per_hour", int, 20,
            "Webhook deliveries of one alert (rule, device, host) an hour at most; a flapping "
            "alert's newest state waits for the next slot. See [alerts.md](alerts.md).",
            min=1, max=3600),
)

SETTINGS_BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}
SECTIONS: frozenset[str] = frozenset(s.key.split(".")[0] for s in SETTINGS)
