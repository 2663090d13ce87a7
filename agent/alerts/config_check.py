"""The OOM a configuration makes possible: the ``[server]`` section against each device's limit.

A prefill-spike OOM gives no warning in any memory trend, but the server's own limits say it in
advance. This module turns the ``server.*`` settings into the estimator's
:func:`~vramscope.agent.estimate.admission_check` and says which limit to lower, and to what
(docs/alerts.md, "config_oom"). :func:`server_from_config` reads the model's ``config.json``;
everything else here is pure.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramscope.agent.errors import ConfigError, UsageError
from vramscope.agent.estimate import (
    Admission,
    AdmissionCheck,
    GiB,
    ModelShape,
    admission_check,
    load_hf_config,
    shape_from_hf_config,
)

RULE = "config_oom"

# The setting (and vLLM's flag) through which each limit of the estimator's check is lowered.
LIMIT_KEYS: dict[str, tuple[str, str]] = {
    "max_batch_tokens": ("server.max_num_batched_tokens", "--max-num-batched-tokens"),
    "max_num_seqs": ("server.max_num_seqs", "--max-num-seqs"),
    "max_model_len": ("server.max_model_len", "--max-model-len"),
}
_DEFAULTS: dict[str, Any] = {
    "server.model": "", "server.max_model_len": 0, "server.max_num_seqs": 0,
    "server.max_num_batched_tokens": 0, "server.kv_pool_gib": 0.0, "server.dtype": "auto",
    "server.weight_dtype": "auto", "server.kv_cache_dtype": "auto", "server.overhead_gib": 1.0,
}


@dataclass(frozen=True)
class ServerLimits:
    """The model and what the server admits, as the ``[server]`` section gives them."""

    shape: ModelShape
    admission: Admission
    overhead_bytes: int = 1 * GiB
    weight_dtype: str | None = None  # None: the model's dtype
    kv_dtype: str | None = None  # None: the model's dtype

    def check(self, limit_bytes: int) -> AdmissionCheck:
        return admission_check(self.shape, self.admission, limit_bytes,
                               overhead_bytes=self.overhead_bytes,
                               weight_dtype=self.weight_dtype, kv_dtype=self.kv_dtype)

    def worst_request(self, check: AdmissionCheck) -> str:
        a = self.admission
        return (f"{a.max_num_seqs} x {a.max_model_len} tokens, {check.prefill_tokens} in one "
                "forward")

    def message(self, check: AdmissionCheck) -> str:
        """One line: fits or not, needed against the limit, and the limit to lower to what."""
        need, limit = check.needed_bytes / GiB, check.limit_bytes / GiB
        head = f"the worst request the server admits ({self.worst_request(check)})"
        if check.fits:
            return (f"{head} fits: it needs {need:.2f} GiB of the {limit:.2f} GiB limit "
                    f"({check.headroom_bytes / GiB:.2f} GiB to spare)")
        return f"{head} cannot fit: it needs {need:.2f} GiB, the limit is {limit:.2f} GiB; " \
               + remedy(check)


def remedy(check: AdmissionCheck) -> str:
    """What to change: the first limit whose lowering makes the worst request fit."""
    if check.lower is None or check.lower_to is None:
        return ("the weights, the runtime and the KV pool alone exceed the limit: serve a "
                "smaller or quantized model (server.weight_dtype) or a smaller KV pool")
    key, flag = LIMIT_KEYS[check.lower]
    return f"lower {key} (vLLM {flag}) to {check.lower_to}"


def _get(config: Mapping[str, Any], key: str) -> Any:
    return config.get(key, _DEFAULTS[key])


def _dtype(config: Mapping[str, Any], key: str) -> str | None:
    value = str(_get(config, key))
    if value == "auto":
        return None
    return "fp8" if value.startswith("fp8") else value  # vLLM's fp8_e4m3, fp8_e5m2: 1 byte


def server_from_config(config: Mapping[str, Any] | None,
                       environ: Mapping[str, str] | None = None) -> ServerLimits | None:
    """The ``[server]`` section as :class:`ServerLimits`; None when ``server.model`` is empty.
    Reads the model's ``config.json`` (``environ``: where the Hugging Face cache is, default
    ``os.environ``); a problem is a :class:`ConfigError` naming the key."""
    model = str(_get(config, "server.model")) if config is not None else ""
    if config is None or not model:
        return None
    where = f"{getattr(config, 'source', None) or '<settings>'}: "
    path = config_path(model, os.environ if environ is None else environ)
    shape = _shape(model, path, _dtype(config, "server.dtype"), where)
    length = _get(config, "server.max_model_len") or shape.max_position_embeddings
    if not length:
        raise ConfigError(f"{where}server.max_model_len is not set and the model's config has "
                          "no max_position_embeddings; set it to vLLM's --max-model-len")
    seqs = _get(config, "server.max_num_seqs")
    if not seqs:
        raise ConfigError(f"{where}server.max_num_seqs must be set with server.model (vLLM's "
                          "--max-num-seqs; vLLM logs its value at start-up)")
    pool_gib = float(_get(config, "server.kv_pool_gib"))
    try:
        admission = Admission(max_model_len=int(length), max_num_seqs=int(seqs),
                              max_batch_tokens=_get(config, "server.max_num_batched_tokens")
                              or None,
                              kv_pool_bytes=int(pool_gib * GiB) if pool_gib else None)
    except UsageError as exc:  # a plain mapping (analyze's settings) skipped the table's checks
        raise ConfigError(f"{where}[server]: {exc}") from None
    return ServerLimits(shape, admission,
                        overhead_bytes=int(float(_get(config, "server.overhead_gib")) * GiB),
                        weight_dtype=_dtype(config, "server.weight_dtype"),
                        kv_dtype=_dtype(config, "server.kv_cache_dtype"))


def config_path(model: str, environ: Mapping[str, str]) -> Path:
    """Where ``server.model``'s config.json is: the file, the folder holding it, or, for a
    Hugging Face model id (``meta-llama/Meta-Llama-3-8B``, as vLLM's ``--model`` takes it),
    the snapshot its ``refs/main`` names in the local Hugging Face cache (where vLLM put it)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path / "config.json"
    if path.exists() or model.count("/") != 1 or model.startswith(("/", ".", "~")):
        return path
    hub = environ.get("HF_HUB_CACHE") or os.path.join(
        environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache",
                                               "huggingface"), "hub")
    folder = Path(hub) / ("models--" + model.replace("/", "--"))
    try:
        revision = (folder / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        return path  # not in the cache: "not found" names what was given
    return folder / "snapshots" / revision / "config.json"


def _shape(model: str, path: Path, dtype: str | None, where: str) -> ModelShape:
    """The model's shape from its config.json."""
    try:
        shape = shape_from_hf_config(load_hf_config(path), name=model)
        return dataclasses.replace(shape, dtype=dtype) if dtype else shape
    except UsageError as exc:
        raise ConfigError(f"{where}server.model = {model!r}: {exc}") from None


class LimitCheck:
    """The check of one device at its current limit, computed again only when the limit moves
    (the alert engine reads it after every sample that carries a limit)."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self.limit_bytes: int | None = None
        self.result: AdmissionCheck | None = None

    def at(self, limit_bytes: int | None) -> AdmissionCheck | None:
        if not limit_bytes:
            return self.result
        if limit_bytes != self.limit_bytes:
            self.limit_bytes, self.result = limit_bytes, self.limits.check(limit_bytes)
        return self.result

    def headroom_bytes(self, limit_bytes: int | None) -> float | None:
        check = self.at(limit_bytes)
        return None if check is None else float(check.headroom_bytes)

    def message(self) -> str | None:
        return None if self.result is None else self.limits.message(self.result)

    def to_json(self) -> dict[str, Any]:
        """The check at the limit it was last made at, as the engine stores it with the
        device's answer and the OOM risk page shows it (:func:`check_json`'s form)."""
        return check_doc(self.limits, self.result, self.limit_bytes)


def startup_lines(limits: ServerLimits,
                  totals: Mapping[int, int]) -> list[tuple[bool, str]]:
    """``(fits, line)`` per device from NVML's totals, for the agent's start-up log."""
    out = []
    for index, total in sorted(totals.items()):
        check = limits.check(total)
        out.append((check.fits, f"config check, device {index}: {limits.message(check)}"))
    return out


def check_json(limits: ServerLimits, limit_bytes: int | None) -> dict[str, Any]:
    """The check as the dashboard shows it (``fits`` None while no limit is known)."""
    return check_doc(limits, limits.check(limit_bytes) if limit_bytes else None, limit_bytes)


def check_doc(limits: ServerLimits, check: AdmissionCheck | None,
              limit_bytes: int | None) -> dict[str, Any]:
    """``check`` (made at ``limit_bytes``; None: no limit known yet) in :func:`check_json`'s
    form."""
    doc: dict[str, Any] = {"model": limits.shape.name, "fits": None, "needed_bytes": None,
                           "limit_bytes": limit_bytes, "headroom_bytes": None,
                           "worst_request": None, "lower": None, "lower_to": None,
                           "message": "no limit known for this device yet"}
    if check is None or not limit_bytes:
        return doc
    lower = LIMIT_KEYS[check.lower][0] if check.lower is not None else None
    doc.update(fits=check.fits, needed_bytes=check.needed_bytes,
               headroom_bytes=check.headroom_bytes, worst_request=limits.worst_request(check),
               lower=None if check.fits else lower,
               lower_to=None if check.fits else check.lower_to,
               message=limits.message(check))
    return doc


def attach_to_document(doc: dict[str, Any], devices: Mapping[int, Any]) -> None:
    """``vramscope analyze``: each device's check at the last limit its samples carried, as
    ``devices[N]["config_check"]`` (``devices``: the engine's, each with a ``config_check``).
    Only with a ``[server]`` section; the ``config_oom`` alert is in ``alerts`` as live."""
    for index, d in devices.items():
        check: LimitCheck | None = getattr(d, "config_check", None)
        entry = doc["devices"].get(str(index))
        if check is not None and entry is not None:
            entry["config_check"] = check_json(check.limits, check.limit_bytes)


def document_lines(doc: Mapping[str, Any]) -> str:
    """The checks of an analysis document as text lines (none without a ``[server]``)."""
    lines = [f"config check, device {dev}: {d['config_check']['message']}"
             for dev, d in doc["devices"].items() if d.get("config_check")]
    return "".join(line + "\n" for line in lines)
