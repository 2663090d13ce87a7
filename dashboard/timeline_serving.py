"""The timeline's serving lanes: the KV pool, the load, the prefix cache and the tokens.

Pure trace builders, document in, Plotly traces out, for ``timeline_figure.py``, which lays the
lanes out: KV blocks as steps with gaps (one share line a pool where a device has several),
running and waiting requests as steps with preemptions as bars, prefix-cache hit tokens as vLLM
counts them with a preempted request's re-use stacked apart, and prompt and generated tokens a
second. Kept apart from the layout: what an inference server's own counters look like on the
timeline changes with the servers, the layout does not.
"""

from __future__ import annotations

from typing import Any

from vramscope.dashboard import figures as f
from vramscope.dashboard import timeline as tl

PREFIX_STYLE = {"hit_tokens": ("prefix-cache hit tokens", "#8250df"),
                "preempted_hit_tokens": ("preempted re-use tokens (not hits to vLLM)", "#afb8c1")}
QUERY_STYLE = ("prefix-cache query tokens", "#8c959f")  # what was looked up: a line over the bars
TOKEN_STYLE = {"prompt_per_s": ("prompt tokens/s", "#0969da"),
               "generation_per_s": ("generated tokens/s", "#bc4c00")}
LOAD_STYLE = {"running": ("running requests", "#2da44e"),
              "waiting": ("waiting requests", "#bf8700")}
PREEMPT_COLOR = "#cf222e"


def kv_steps(traces: list[dict[str, Any]], s: dict[str, dict[str, list[Any]]],
              bucket_s: float, held_s: float) -> list[dict[str, Any]]:
    """The KV block counters as steps with gaps (the tokens-per-block ratio stays a line)."""
    names = {"KV blocks used": "kv_blocks_used", "KV blocks cached": "kv_blocks_cached",
             "KV blocks total": "kv_blocks_total"}
    for t in traces:
        key = names.get(t["name"])
        if key is None:
            continue
        xs, ys = tl.step_points(s[key]["ts"], s[key]["max"], s[key].get("last"), bucket_s,
                                last_ts=s[key].get("last_ts"), held_s=held_s)
        t["x"], t["y"] = [f.ms(x) for x in xs], ys
        t["line"] = {**t.get("line", {}), "shape": "hv"}
        t["connectgaps"] = False
    return traces


def kv_pool_traces(pools: list[dict[str, Any]], bucket_s: float,
                    held_s: float) -> list[dict[str, Any]]:
    """Several KV pools on one device: each process's pool as the share of its own blocks in
    use, a step line each (a colour each, in the order of their pids as the memory lane's
    processes), named by process and pool size, the blocks in the hover. On
    one block axis a 63-block pool is a flat line under a 16,384-block one; as shares, a full
    small pool reads 100 % beside a big one at 3 %."""
    out = []
    for i, p in enumerate(pools):
        ratio = p["series"].get("kv_used_ratio")
        if not ratio or not ratio["ts"]:
            continue
        color = f.PROCESS_COLORS[i % len(f.PROCESS_COLORS)]
        xs, ys = tl.step_points(ratio["ts"], ratio["max"], None, bucket_s, held_s=held_s)
        # the blocks behind each drawn point: the same steps (the same buckets: a KV sample
        # carries both counts), so point for point
        blocks = [tl.step_points(ratio["ts"], ratio[key], None, bucket_s, held_s=held_s)[1]
                  for key in ("used", "total")]
        name = (f"{f.text(p['process'])} · KV used of its {p['blocks_total']:,} blocks"
                + (" · ended" if p["ended"] else ""))
        out.append(f._line(name, [f.ms(x) for x in xs], ys, color, xaxis="x", yaxis="y3",
                           line={"color": color, "width": 1.6, "shape": "hv"},
                           connectgaps=False, legendgroup=f"process {p['pid']}",
                           customdata=[None if u is None else [u, n]
                                       for u, n in zip(*blocks, strict=True)],
                           hovertemplate="%{y:.1%} (%{customdata[0]:,} of "
                                         "%{customdata[1]:,} blocks)"))
    return out


def mixed_pools(traces: list[dict[str, Any]], pools: int) -> list[dict[str, Any]]:
    """Several pools where no per-pool series were read (a window of more raw rows than the
    bound): the device's block counters, each bucket's largest of any pool, labelled as that
    (the line above the plot says to zoom in), and no tokens per block over several pools."""
    out = []
    for t in traces:
        if t["yaxis"] != "y3":
            continue
        t["name"] = f"{t['name']}, largest of {pools} pools per bucket"
        out.append(t)
    return out


def load_traces(load: dict[str, dict[str, list[Any]]], bucket_s: float
                 ) -> list[dict[str, Any]]:
    """Running and waiting requests as steps (each a count held until its next change) and
    preemptions per bucket as bars, on the load lane (y8)."""
    out = []
    for key, (name, color) in LOAD_STYLE.items():
        if key not in load:
            continue
        part = load[key]
        xs, ys = tl.step_points(part["ts"], part["max"], part.get("last"), bucket_s,
                                gaps=False)
        out.append(f._line(name, [f.ms(x) for x in xs], ys, color, xaxis="x", yaxis="y8",
                           line={"color": color, "width": 1.6, "shape": "hv"},
                           connectgaps=False, hovertemplate=f"%{{y}} {name}<extra></extra>"))
    if "preemptions" in load:
        part = load["preemptions"]
        out.append({"type": "bar", "name": "preemptions", "x": [f.ms(t) for t in part["ts"]],
                    "y": part["count"], "width": max(bucket_s, 1e-3) * 1000.0, "offset": 0,
                    "marker": {"color": PREEMPT_COLOR, "line": {"width": 0}}, "xaxis": "x",
                    "yaxis": "y8",
                    "hovertemplate": "%{y} preemptions in this bucket<extra></extra>"})
    return out


def prefix_traces(prefix: dict[str, Any] | None, bucket_s: float) -> list[dict[str, Any]]:
    """Prefix-cache hit tokens per bucket as vLLM counts them, and a preempted request's re-use
    of its own blocks stacked on them in grey (its own series: vLLM does not call it a hit),
    with the tokens looked up as steps over them (hits / queries is vLLM's hit rate: the
    lane's title gives the window's), on the prefix lane (y9)."""
    if not prefix or not prefix["ts"]:
        return []
    xs = [f.ms(t) for t in prefix["ts"]]
    out = [{"type": "bar", "name": name, "x": xs, "y": prefix[key],
            "width": max(bucket_s, 1e-3) * 1000.0, "offset": 0,
            "marker": {"color": color, "line": {"width": 0}}, "xaxis": "x", "yaxis": "y9",
            "hovertemplate": f"%{{y}} {name}<extra></extra>"}
           for key, (name, color) in PREFIX_STYLE.items() if any(prefix[key])]
    queries = prefix.get("query_tokens") or []
    if any(queries):
        name, color = QUERY_STYLE
        xs, ys = tl.step_points(prefix["ts"], queries, None, bucket_s, gaps=False)
        out.append(f._line(name, [f.ms(x) for x in xs], ys, color, xaxis="x", yaxis="y9",
                           line={"color": color, "width": 1.2, "shape": "hv"},
                           hovertemplate=f"%{{y}} {name}<extra></extra>"))
    return out


def token_traces(tokens: dict[str, list[Any]] | None, bucket_s: float
                  ) -> list[dict[str, Any]]:
    """Prompt and generated tokens per second per bucket as steps, on the tokens lane
    (y10)."""
    if not tokens or not tokens["ts"]:
        return []
    out = []
    for key, (name, color) in TOKEN_STYLE.items():
        if not any(tokens[key]):
            continue
        xs, ys = tl.step_points(tokens["ts"], tokens[key], None, bucket_s)
        out.append(f._line(name, [f.ms(x) for x in xs], ys, color, xaxis="x", yaxis="y10",
                           line={"color": color, "width": 1.4, "shape": "hv"},
                           connectgaps=False,
                           hovertemplate=f"%{{y:.1f}} {name}<extra></extra>"))
    return out
