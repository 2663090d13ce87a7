"""The OpenAPI 3.0 document of ``/api/v1`` (served at ``/api/v1/openapi.json``).

Written by hand next to the handlers and checked against them by schemathesis
(``tests/dashboard/test_api_schemathesis.py``): every response must match these schemas, and no
input the schema allows may produce a 5xx.
"""

from __future__ import annotations

from typing import Any

from vramscope.agent.analysis.severity import LEVELS
from vramscope.dashboard.params import DEFAULT_MAX_POINTS, MAX_POINTS_LIMIT
from vramscope.dashboard.timeline import TIMELINE_COLUMNS

NUM = {"type": "number"}
INT = {"type": "integer"}
STR = {"type": "string"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "nullable": True}


def obj(props: dict[str, Any], required: bool = True, extra: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props,
                           "additionalProperties": extra}
    if required:
        out["required"] = list(props)
    return out


def array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}


DEVICE = _query("device", {"type": "integer", "minimum": 0, "maximum": 4095, "default": 0},
                "CUDA device index.")
HOST = _query("host", {"type": "string", "maxLength": 255},
              "Host name (default: the store's own host).")
START = _query("start", {"type": "number", "minimum": 0, "maximum": 1e11},
               "Window start, Unix seconds (default: end minus the default span).")
END = _query("end", {"type": "number", "minimum": 0, "maximum": 1e11},
             "Window end, Unix seconds (default: the newest sample).")
SPAN = _query("span", {"type": "number", "minimum": 1, "maximum": 366 * 86400},
              "Window length in seconds when start is left out (default 1 h; 6 h for the "
              "analysis, leaks and risk).")
MAX_POINTS = _query("max_points", {"type": "integer", "minimum": 1, "maximum": MAX_POINTS_LIMIT,
                                   "default": DEFAULT_MAX_POINTS},
                    "Buckets per series; each keeps its min and max, so peaks survive.")
COLUMNS = _query("columns", {"type": "string"},
                 "Comma-separated sample columns; default all of: " + ", ".join(TIMELINE_COLUMNS))

ERROR = obj({"error": obj({"status": INT, "title": STR, "message": STR,
                           "parameter": STR}, required=False)})
SERIES = obj({"ts": array(NUM), "min": array(nullable(NUM)), "max": array(nullable(NUM))},
             required=False)
LATEST = nullable({"type": "object", "additionalProperties": True,
                   "properties": {"last_ts_s": NUM, "first_ts_s": NUM,
                                  "phase": nullable(STR), "pid": nullable(INT),
                                  "unexplained_bytes": nullable(INT),
                                  "processes": array(obj({
                                      "pid": nullable(INT), "process": STR,
                                      "name": nullable(STR), "rank": nullable(INT),
                                      "limit_bytes": nullable(INT),
                                      "reserved_bytes": nullable(INT)}, required=False))}})
LEVEL = {"type": "string", "enum": list(LEVELS)}
# the alert engine's verdict: the worst severity of the device's active alerts, and those alerts
VERDICT = obj({"level": LEVEL, "reasons": array(obj({
    "rule": STR, "severity": STR, "message": nullable(STR), "fired_ts_s": NUM}))})
DEVICE_ROW = obj({"host": STR, "device": INT, "name": nullable(STR), "uuid": nullable(STR),
                  "parent_uuid": nullable(STR), "physical_index": nullable(INT),
                  "total_bytes": nullable(INT), "risk": LEVEL, "verdict": VERDICT,
                  "active_alerts": INT, "latest": LATEST, "last_sample_age_s": nullable(NUM),
                  "stale": {"type": "boolean"},
                  "freshness": {"type": "string",
                                "enum": ["no_data", "live", "idle", "catching_up", "stale"]},
                  "kv_usage_ratio": nullable(NUM), "requests_per_min": NUM,
                  # each process's KV pool now (the ratio above: the fullest one's)
                  "kv_pools": array(obj({"pid": nullable(INT), "process": nullable(STR),
                                         "kv_blocks_used": INT, "kv_blocks_total": INT,
                                         "kv_usage_ratio": NUM}))})
FRESHNESS = obj({"now_s": NUM, "newest_ts_s": nullable(NUM), "age_s": nullable(NUM),
                 "stale_after_s": NUM,
                 "state": {"type": "string",
                           "enum": ["no_data", "live", "idle", "catching_up", "stale"]},
                 "stale": {"type": "boolean"},
                 "why": nullable(STR),  # "agent" or "clients": who stopped reporting
                 "agent_age_s": nullable(NUM), "clients": nullable(INT)})
HOST_ROW = obj({"name": STR, "first_seen_s": nullable(NUM), "last_seen_s": nullable(NUM)},
               required=False)
PROCESS = obj({"pid": INT, "name": nullable(STR), "model": nullable(STR),
               "devices": nullable(STR), "host": STR, "first_seen_s": NUM, "last_seen_s": NUM,
               "rank": nullable(INT), "local_rank": nullable(INT), "world_size": nullable(INT),
               "ns_pid": nullable(INT),
               "state": {"type": "string", "enum": ["connected", "ended", "unknown"]},
               "kv_blocks_used": nullable(INT), "kv_blocks_total": nullable(INT),
               "kv_usage_ratio": nullable(NUM), "kv_at_s": nullable(NUM),
               "requests_per_min": nullable(NUM)},
              required=False)
ALERT = obj({"id": INT, "rule": STR, "severity": STR, "fired_ts_s": NUM,
             "resolved_ts_s": nullable(NUM), "value": nullable(NUM), "message": nullable(STR),
             "labels": {"type": "object", "additionalProperties": True},
             "device": nullable(INT), "host": nullable(STR), "value_text": nullable(STR)})
HOLDER = obj({"size_bytes": INT, "frames": array(STR), "phase": nullable(STR)})
POSTMORTEM = obj({"id": INT, "ts_s": NUM, "device": INT, "pid": nullable(INT), "phase": STR,
                  "failed_alloc_bytes": nullable(INT), "driver_free_bytes": nullable(INT),
                  "device_total_bytes": nullable(INT), "allocated_bytes": nullable(INT),
                  "reserved_bytes": nullable(INT), "largest_free_block_bytes": nullable(INT),
                  "external_fragmentation_ratio": nullable(NUM),
                  "requests_in_flight": array(STR), "top_holders": array(HOLDER),
                  "segments": array({"type": "object"}), "message": nullable(STR),
                  "cause": nullable(STR), "remedies": array(STR), "host": nullable(STR),
                  "snapshot_available": {"type": "boolean"}})
FIGURE = obj({"data": array({"type": "object"}), "layout": {"type": "object"}})
TIMELINE = obj({
    "device": INT, "host": STR, "start": NUM, "end": NUM, "max_points": INT, "bucket_s": NUM,
    "series": {"type": "object", "additionalProperties": SERIES},
    "phases": array(obj({"phase": {"type": "string",
                                   "enum": ["prefill", "decode", "idle", "setup"]},
                         "start": NUM, "end": NUM})),
    "phase_source": STR,
    "events": array(obj({"ts": NUM, "name": STR, "request_id": nullable(STR),
                         "message": nullable(STR), "pid": nullable(INT)})),
    "events_truncated": {"type": "boolean"},
    "retries": array(obj({"ts": NUM, "count": NUM})),
    "request_rate": obj({"bucket_s": NUM, "ts": array(NUM), "per_min": array(NUM)}),
    "alerts": array(obj({"ts": NUM, "severity": STR, "rule": STR, "message": nullable(STR)})),
    # each process's allocated / reserved where raw samples keep its pid (docs/api.md)
    "processes": array(obj({"pid": nullable(INT), "name": nullable(STR), "model": nullable(STR),
                            "rank": nullable(INT), "label": STR, "process": STR,
                            "ended": {"type": "boolean"}, "last_ts": NUM,
                            "series": {"type": "object", "additionalProperties": SERIES}})),
    "processes_from": nullable(NUM), "processes_truncated": {"type": "boolean"},
    "process_pids": array(nullable(INT)), "mixed_processes": {"type": "boolean"},
    "mixed_processes_note": nullable(STR),
    # each process's KV pool, its share used against its own size (docs/api.md)
    "kv_pools": array(obj({"pid": nullable(INT), "name": nullable(STR), "model": nullable(STR),
                           "rank": nullable(INT), "label": STR, "process": STR,
                           "ended": {"type": "boolean"}, "last_ts": NUM,
                           "blocks_total": nullable(INT),
                           "series": {"type": "object", "additionalProperties": True}})),
    "kv_pool_pids": array(nullable(INT)), "several_kv_pools": {"type": "boolean"},
    "kv_pools_note": nullable(STR),
    # the floor the leading process's leak detector judged on, from its stored verdict rows
    "floor": obj({"pid": nullable(INT), "process": nullable(STR),
                  "points": array(array(NUM))})})
# a device with no stored risk answer yet has none: null, which an enum must list
NO_LEVEL_YET = {**nullable(LEVEL), "enum": [*LEVEL["enum"], None]}
FLEET_COUNTS = obj({"devices": INT, "critical": INT, "warning": INT, "leaking": INT,
                    "stale": INT})
FLEET_DEVICE = obj({
    "host": STR, "device": INT, "model": nullable(STR), "uuid": nullable(STR),
    "total_bytes": nullable(INT), "level": NO_LEVEL_YET, "time_to_oom_s": nullable(NUM),
    "cause": nullable(STR), "cause_text": nullable(STR), "risk_process": nullable(STR),
    "leak": nullable(STR),
    "leak_slope_bytes_per_h": nullable(NUM), "leak_process": nullable(STR),
    "verdict_ts_s": nullable(NUM), "newest_ts_s": nullable(NUM),
    "last_sample_age_s": nullable(NUM), "freshness": STR, "stale": {"type": "boolean"}})
FLEET = obj({
    "now_s": NUM, "verdicts_from": STR,
    "filters": obj({"host": nullable(STR), "model": nullable(STR)}),
    "choices": obj({"hosts": array(STR), "models": array(STR)}),
    "fleet": FLEET_COUNTS, "counts": FLEET_COUNTS, "devices": array(FLEET_DEVICE),
    "hosts": array(obj({"host": STR, "models": array(STR), "devices": INT, "critical": INT,
                        "warning": INT, "leaking": INT, "stale": INT,
                        "worst": NO_LEVEL_YET, "soonest_time_to_oom_s": nullable(NUM),
                        "attention": array(FLEET_DEVICE), "attention_more": INT}))})
ESTIMATE_PARAMS = [
    _query("model", {"type": "string", "maxLength": 80}, "A name for the estimate."),
    _query("layers", {"type": "integer", "minimum": 1, "maximum": 1000}, "Decoder layers."),
    _query("kv_heads", {"type": "integer", "minimum": 1, "maximum": 1024}, "KV heads."),
    _query("head_dim", {"type": "integer", "minimum": 1, "maximum": 4096}, "Head dimension."),
    _query("hidden", {"type": "integer", "minimum": 1, "maximum": 1000000}, "Hidden size."),
    _query("intermediate", {"type": "integer", "minimum": 0, "maximum": 10000000}, "MLP size."),
    _query("vocab", {"type": "integer", "minimum": 0, "maximum": 10000000}, "Vocabulary."),
    _query("params_b", {"type": "number", "minimum": 0.001, "maximum": 10000},
           "Parameters, billions (default: counted from the shape)."),
    _query("gated", {"type": "boolean"}, "Gated MLP (gate, up, down), as Llama's (default)."),
    _query("dtype", {"type": "string", "maxLength": 32}, "Weight dtype, e.g. bfloat16."),
    _query("context", {"type": "integer", "minimum": 1, "maximum": 10000000}, "Context tokens."),
    _query("concurrency", {"type": "integer", "minimum": 1, "maximum": 100000}, "Sequences."),
    _query("margin", {"type": "number", "minimum": 0, "maximum": 0.99}, "Safety margin."),
    _query("gpu_gib", {"type": "number", "minimum": 0.001, "maximum": 100000},
           "GPU memory in GiB (default: the largest measured limit)."),
    HOST,
]
CAPACITY = obj({"devices": array(obj({"host": STR, "device": INT,
                                      "peaks": nullable({"type": "object"})})),
                "shape": {"type": "object"}, "estimate": nullable({"type": "object"}),
                "estimate_problem": nullable(STR)})

CONFIG_CHECK = obj({"model": nullable(STR), "fits": nullable({"type": "boolean"}),
                    "needed_bytes": nullable(INT), "limit_bytes": nullable(INT),
                    "headroom_bytes": nullable(INT), "worst_request": nullable(STR),
                    "lower": nullable(STR), "lower_to": nullable(INT), "message": STR})


def _op(summary: str, schema: dict[str, Any], parameters: list[dict[str, Any]] | None = None,
        errors: tuple[int, ...] = (400,), content_type: str = "application/json"
        ) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": "OK",
                                         "content": {content_type: {"schema": schema}}}}
    for code in errors:
        responses[str(code)] = {"description": "error",
                                "content": {"application/json": {"schema": ERROR}}}
    return {"get": {"summary": summary, "parameters": parameters or [], "responses": responses}}


PM_ID = {"name": "pm_id", "in": "path", "required": True,
         "schema": {"type": "integer", "minimum": 0, "maximum": 2**62}}


def paths() -> dict[str, Any]:
    window = [DEVICE, HOST, START, END, SPAN]
    return {
        "/hosts": _op("Hosts that have reported, first and last seen from their samples",
                      obj({"hosts": array(HOST_ROW)}), errors=()),
        "/freshness": _op("How old the newest sample is, and whether that is stale",
                          FRESHNESS, errors=()),
        "/devices": _op("Every device with its current values and risk level",
                        obj({"devices": array(DEVICE_ROW)}), [
                            _query("device", {"type": "integer", "minimum": 0,
                                              "maximum": 4095},
                                   "Only this device's row (of host, default the store's "
                                   "own), read without the others'."), HOST]),
        "/processes": _op("Server processes", obj({"processes": array(PROCESS)}), errors=()),
        "/overview": _op("Hosts, devices, processes and active alerts", obj({
            "now_s": NUM, "freshness": FRESHNESS, "level": LEVEL, "hosts": array(HOST_ROW),
            "devices": array(DEVICE_ROW),
            "processes": array(PROCESS), "alerts": array(ALERT)}), [
            _query("figures", {"type": "boolean"}, "Add the overview and processes figures "
                   "(those of /figures/overview and /figures/processes), built from the same "
                   "device rows.")]),
        "/fleet": _op("Every device of every host, in the order that needs attention (stored "
                      "OOM-risk level, time to OOM, leak, stale), and grouped by host",
                      FLEET, [_query("host", {"type": "string", "maxLength": 255},
                                     "Only this host's devices (empty: every host)."),
                              _query("model", {"type": "string", "maxLength": 96},
                                     "Only devices of this GPU model (empty: every model).")]),
        "/timeline": _op("Downsampled series, phase bands and event markers", TIMELINE,
                         [*window, MAX_POINTS, COLUMNS], errors=(400, 404)),
        "/alerts": _op("Alerts, newest first", obj({"alerts": array(ALERT)}), [
            _query("active", {"type": "boolean"}, "Only alerts still firing."),
            _query("limit", {"type": "integer", "minimum": 1, "maximum": 10000}, "At most."),
            HOST]),
        "/postmortems": _op("OOM post-mortems", obj({"postmortems": array(POSTMORTEM)}), [
            _query("device", {"type": "integer", "minimum": 0, "maximum": 4095}, "Device."),
            HOST]),
        "/postmortems/{pm_id}": _op("One post-mortem", POSTMORTEM, [PM_ID], errors=(404,)),
        "/postmortems/{pm_id}/snapshot": _op(
            "The PyTorch snapshot kept with a post-mortem", {"type": "string",
                                                             "format": "binary"},
            [PM_ID], errors=(404,), content_type="application/octet-stream"),
        "/analysis": _op("The vramscope.analysis/1 document for a device and window",
                         obj({"format": STR, "devices": {"type": "object"},
                              "alerts": array({"type": "object"})}, required=False),
                         window, errors=(400, 404, 503)),
        "/capacity": _op("Measured peaks beside the capacity estimate", CAPACITY,
                         ESTIMATE_PARAMS),
        "/figures/overview": _op("Plotly figure: memory by device", FIGURE, errors=()),
        "/figures/processes": _op("Plotly figure: each device's processes stacked under its "
                                  "NVML total, with the unexplained rest", FIGURE, errors=()),
        "/figures/timeline": _op("Plotly figure: the device timeline", FIGURE,
                                 [*window, MAX_POINTS, COLUMNS], errors=(400, 404)),
        "/figures/leaks": _op("Plotly figure and the stored leak verdicts: the idle floor", obj({
            "figure": FIGURE, "result": {"type": "object"}, "method": STR,
            "verdicts_from": STR, "processes": array({"type": "object"}),
            "floor_points": INT, "limit_bytes": nullable(INT),
            "orphaned": array({"type": "object"}),
            "makeup": nullable({"type": "object"})}), window, errors=(400, 404)),
        "/figures/risk": _op("Plotly figure: headroom, forecast, warnings", obj({
            "figure": FIGURE, "warnings": array({"type": "object"}), "forecast_method": STR,
            "verdicts_from": STR, "processes": array({"type": "object"}),
            "limit_bytes": nullable(INT), "latest_headroom_bytes": nullable(INT),
            # the riskiest process's stored verdict (vramscope.verdict/1's risk part)
            "now": nullable(obj({"ts_s": NUM, "level": LEVEL, "reasons": array(STR),
                                 "cause": nullable(STR), "at_risk_from_pid": nullable(INT),
                                 "cause_text": nullable(STR), "pid": nullable(INT),
                                 "process": STR, "headroom_bytes": nullable(INT),
                                 "time_to_oom_s": nullable(NUM),
                                 "time_to_oom_low_s": nullable(NUM),
                                 "time_to_oom_high_s": nullable(NUM)}))}), window,
            errors=(400, 404)),
        "/config-check": _op("The [server] section's worst admissible request against the "
                             "device's limit (check: null without a [server] section)", obj({
            "device": INT, "check": nullable(CONFIG_CHECK)}), [DEVICE, HOST], errors=(400, 404)),
        "/figures/capacity": _op("Plotly figure: peaks and estimate, with the capacity document",
                                 obj({"figure": FIGURE, "capacity": CAPACITY}),
                                 ESTIMATE_PARAMS),
        "/figures/postmortems/{pm_id}": _op("Plotly figures: segment map and top holders",
                                            obj({"segments": FIGURE, "holders": FIGURE}),
                                            [PM_ID], errors=(404,)),
    }


def document() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "vramscope dashboard API", "version": "1",
                 "description": "GPU memory timelines, alerts, post-mortems and analysis. "
                                "Bytes are integers, times Unix seconds. Errors are "
                                "{\"error\": {status, title, message, parameter?}}."},
        "servers": [{"url": "/api/v1"}],
        "paths": paths(),
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
