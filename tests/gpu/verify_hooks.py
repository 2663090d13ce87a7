"""GPU verification of the in-server hooks, run on the H200: figures, recorded data and traces.

    PYTHONPATH=. python tests/gpu/verify_hooks.py OUT_DIR [--quick]

Writes to OUT_DIR: ``results.json`` (every figure and check below), ``gpu_healthy.jsonl``,
``gpu_leak.jsonl``, ``gpu_oom.jsonl`` (trace v1), ``gpu_postmortem.json``,
``gpu_snapshot_segments.json`` (a light snapshot at the OOM, for the CPU segsum test) and
``cuda_memory_stats_nested.json`` (one ``torch._C._cuda_memoryStats`` reading). Each section
is independent: a failure is recorded in ``results.json`` and the next section runs.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from vramscope.agent.config import parse_config
from vramscope.agent.trace import write_trace
from vramscope.hooks import install as inst
from vramscope.hooks import phase as ph
from vramscope.hooks.sink import ListSink
from vramscope.hooks.transformers_integration import attach_transformers

from tools.bench import hooks as bench

GiB = 2**30
STAT_KEYS = {"allocated_bytes": "allocated_bytes.all.current",
             "reserved_bytes": "reserved_bytes.all.current",
             "active_bytes": "active_bytes.all.current",
             "inactive_split_bytes": "inactive_split_bytes.all.current",
             "requested_bytes": "requested_bytes.all.current",
             "num_alloc_retries": "num_alloc_retries", "num_ooms": "num_ooms"}


def config(**sections: dict[str, Any]) -> Any:
    return parse_config(sections, None, {})


def allocator_source() -> Any:
    return inst._INSTALLED.sampler.tasks[0].source


def env() -> dict[str, Any]:
    import transformers

    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "device": torch.cuda.get_device_name(0),
            "total_memory_bytes": torch.cuda.get_device_properties(0).total_memory,
            "python": sys.version.split()[0]}


def exactness(model: Any) -> dict[str, Any]:
    """Inside each forward (after the phase hook), read() and memory_stats() back to back."""
    inst.install(config(sampling={"allocator_interval_s": 3600.0}), sink=ListSink())
    handle = attach_transformers(model)
    source, rows = allocator_source(), []

    def check(module: Any, args: Any, kwargs: Any) -> None:
        sample = source.read()
        stats = torch.cuda.memory_stats(0)
        diffs = {k: (getattr(sample, k), stats[v]) for k, v in STAT_KEYS.items()
                 if getattr(sample, k) != stats[v]}
        rows.append({"phase": sample.phase.value, "allocated_bytes": sample.allocated_bytes,
                     "reserved_bytes": sample.reserved_bytes, "diffs": diffs})

    hook = model.register_forward_pre_hook(check, with_kwargs=True)
    try:
        ids = torch.randint(0, 32000, (8, 256), device="cuda")
        model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    finally:
        hook.remove()
        handle.detach()
        inst.uninstall()
    return {"checks": rows, "all_equal": all(not r["diffs"] for r in rows),
            "phases": sorted({r["phase"] for r in rows})}


def peaks(model: Any, batch: int, prompt: int, new: int, reset_mode: bool) -> dict[str, Any]:
    """Span peaks from phase events against max_memory_allocated() at the same boundaries."""
    sink = ListSink()
    inst.install(config(), sink=sink)
    if reset_mode:
        ph.use_peak_resets(True)
    handle = attach_transformers(model)
    truth: dict[str, int] = {}
    forwards = [0]

    def at_boundary(module: Any, args: Any, kwargs: Any) -> None:
        forwards[0] += 1
        if forwards[0] == 2:  # first decode step: the prefill span just ended
            truth["prefill"] = torch.cuda.max_memory_allocated(0)

    # Observe mode: read after our hook (no allocation between). Reset mode: before it, since
    # our transition resets the peak counter.
    hook = model.register_forward_pre_hook(at_boundary, with_kwargs=True, prepend=reset_mode)
    ids = torch.randint(0, 32000, (batch, prompt), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(0)
    try:
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                       pad_token_id=0)
        truth["whole_generate"] = torch.cuda.max_memory_allocated(0)
    finally:
        hook.remove()
        handle.detach()
        inst.uninstall()
    spans = {e.data["ended_phase"]: {"peak": e.data.get("ended_peak_allocated_bytes"),
                                     "exact": e.data.get("ended_peak_exact"),
                                     "steps": e.data["ended_steps"]}
             for e in sink.events() if e.name == "phase" and e.data["ended_phase"] != "idle"}
    return {"batch": batch, "prompt": prompt, "new_tokens": new, "reset_mode": reset_mode,
            "spans": spans, "truth": truth,
            "prefill_matches": spans.get("prefill", {}).get("peak") == truth.get("prefill"),
            "decode_matches_whole_when_exact": None if reset_mode else (
                (not spans.get("decode", {}).get("exact"))
                or spans["decode"]["peak"] == truth["whole_generate"])}


def cb_config(num_blocks: int, max_batch_tokens: int) -> dict[str, Any]:
    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError:
        return {}
    return {"continuous_batching_config": ContinuousBatchingConfig(
        num_blocks=num_blocks, max_batch_tokens=max_batch_tokens)}


def generate_batch(model: Any) -> dict[str, Any]:
    from transformers import GenerationConfig

    sink = ListSink(max_records=10**7)
    inst.install(config(sampling={"allocator_interval_s": 0.002}), sink=sink)
    handle = attach_transformers(model, sink=sink)
    rng = random.Random(3)
    prompts = [[rng.randrange(1, 32000) for _ in range(rng.randrange(32, 600))]
               for _ in range(48)]
    gen = GenerationConfig(max_new_tokens=48, do_sample=False, eos_token_id=-1, pad_token_id=0)
    t0 = time.perf_counter()
    import inspect

    accepted = inspect.signature(model.generate_batch).parameters
    extra = {k: v for k, v in dict(cb_config(4096, 1024), progress_bar=False).items()
             if k in accepted}
    try:
        out = model.generate_batch(prompts, generation_config=gen, **extra)
    finally:
        hooked = list(handle.hooks)
        handle.detach()
        inst.uninstall()
    ended = [e.data for e in sink.events() if e.name == "phase"]
    by_phase: dict[str, int] = {}
    for s in sink.samples():
        by_phase[s.phase.value] = by_phase.get(s.phase.value, 0) + 1
    return {"seconds": round(time.perf_counter() - t0, 3), "requests": len(out),
            "kwargs": sorted(extra),
            "hooks": hooked, "missing": handle.missing,
            "generated_tokens": sum(len(r.generated_tokens) for r in out.values()),
            "prefill_tokens": sum(d["ended_prefill_tokens"] for d in ended),
            "decode_tokens": sum(d["ended_decode_tokens"] for d in ended),
            "mixed_steps": sum(d["ended_mixed_steps"] for d in ended),
            "phase_events": len(ended), "samples_by_phase": by_phase,
            "prompt_tokens": sum(len(p) for p in prompts)}


class _Nvml:
    interval_s = 0.1

    def __init__(self) -> None:
        from vramscope.agent.sources.nvml import open_nvml

        self.source = open_nvml()

    def read(self) -> Any:
        return self.source.read() if self.source else None


def _serve(model: Any, seconds: float, *, leak_bytes: int = 0, grow: bool = False,
           seed: int = 0) -> tuple[ListSink, list[Any], str | None]:
    """Requests with idle gaps for ``seconds``; optionally leak a tensor per request."""
    sink = ListSink(max_records=10**6)
    report = inst.install(config(sampling={"allocator_interval_s": 0.05,
                                           "snapshot_interval_s": 2.0},
                                 hooks={"history": "python" if grow else "off",
                                        "postmortem_min_interval_s": 5.0}), sink=sink)
    inst._INSTALLED.sampler.add(_Nvml())
    handle = attach_transformers(model)
    rng, leaked, error = random.Random(seed), [], None
    end, batch = time.monotonic() + seconds, 4
    try:
        while time.monotonic() < end:
            prompt = rng.randrange(128, 1024)
            ids = torch.randint(0, 32000, (batch, prompt), device="cuda")
            model.generate(ids, max_new_tokens=rng.randrange(8, 32), do_sample=False,
                           pad_token_id=0)
            if leak_bytes:
                leaked.append(torch.empty(leak_bytes, dtype=torch.uint8, device="cuda"))
            if grow:
                batch *= 2
            time.sleep(rng.uniform(0.1, 0.3))
    except torch.OutOfMemoryError as exc:
        error = str(exc).splitlines()[0]
        time.sleep(1.0)  # a second of samples after the OOM
    finally:
        handle.detach()
        inst.uninstall()
    del leaked
    torch.cuda.empty_cache()
    return sink, report.to_json(), error


def _write(out: Path, name: str, sink: ListSink) -> dict[str, Any]:
    with open(out / name, "w", encoding="utf-8") as fh:
        lines = write_trace(fh, sink.samples(), sink.events())
    return {"file": name, "lines": lines, "bytes": (out / name).stat().st_size,
            "samples": len(sink.samples()), "events": len(sink.events())}


def traces(model: Any, out: Path, quick: bool) -> dict[str, Any]:
    secs = 6 if quick else 25
    sink, report, _ = _serve(model, secs)
    healthy = _write(out, "gpu_healthy.jsonl", sink)
    healthy["install_report"] = report
    healthy["snapshot_costs_s"] = [e.data["cost_s"] for e in sink.events()
                                   if e.name == "snapshot"]
    sink, _, _ = _serve(model, secs, leak_bytes=64 * 2**20, seed=1)
    leak = _write(out, "gpu_leak.jsonl", sink)
    return {"healthy": healthy, "leak": leak}


def oom_trace(model: Any, out: Path) -> dict[str, Any]:
    torch.cuda.empty_cache()
    limit = torch.cuda.memory_reserved(0) + 12 * GiB
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(limit / total, 0)
    try:
        sink, _, error = _serve(model, 120, leak_bytes=256 * 2**20, grow=True, seed=2)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
    result = _write(out, "gpu_oom.jsonl", sink)
    result["error"] = error
    pms = sink.postmortems()
    if pms:
        (out / "gpu_postmortem.json").write_text(json.dumps(pms[0].to_json(), indent=1))
        pm = pms[0]
        result["postmortem"] = {
            "failed_alloc_bytes": pm.failed_alloc_bytes, "phase": pm.phase.value,
            "largest_free_block_bytes": pm.largest_free_block_bytes,
            "external_fragmentation_ratio": pm.external_fragmentation_ratio,
            "driver_free_bytes": pm.driver_free_bytes, "limit_bytes": pm.device_total_bytes,
            "allocated_bytes": pm.allocated_bytes, "reserved_bytes": pm.reserved_bytes,
            "requests_in_flight": list(pm.requests_in_flight),
            "top_holders": [[h.size_bytes, list(h.frames[:3]),
                             h.phase.value if h.phase else None] for h in pm.top_holders[:5]],
            "message": pm.message}
    return result


def direct_oom(out: Path) -> dict[str, Any]:
    """A known-size allocation over the limit: the post-mortem must name exactly that size."""
    sink = ListSink()
    inst.install(config(hooks={"postmortem_min_interval_s": 0.0}), sink=sink)
    torch.cuda.empty_cache()
    whole = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    del whole  # one cached 2 GiB segment; the pieces below are carved out of it
    keep = [torch.empty(128 * 2**20, dtype=torch.uint8, device="cuda") for _ in range(16)]
    del keep[1::2]  # eight 128 MiB holes inside a segment the OOM retry cannot release
    limit = torch.cuda.memory_reserved(0) + 1 * GiB
    torch.cuda.set_per_process_memory_fraction(limit / torch.cuda.get_device_properties(0)
                                               .total_memory, 0)
    want = 3 * GiB
    try:
        with ph.phase("prefill", request_id="big-1"):
            torch.empty(want, dtype=torch.uint8, device="cuda")
        raised = None
    except torch.OutOfMemoryError as exc:
        raised = str(exc).splitlines()[0]
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
    segments = torch.cuda.memory_snapshot()
    (out / "gpu_snapshot_segments.json").write_text(json.dumps(
        {"comment": "torch.cuda.memory_snapshot() on the H200 right after a provoked OOM",
         "segments": [dict(s, blocks=[{k: b[k] for k in ("address", "size", "requested_size",
                                                          "state")} for b in s["blocks"]])
                      for s in segments if s["device"] == 0]}))
    inst.uninstall()
    del keep
    pms = sink.postmortems()
    pm = pms[0] if pms else None
    return {"raised": raised, "postmortems": len(pms),
            "failed_alloc_bytes": pm and pm.failed_alloc_bytes, "wanted_bytes": want,
            "names_failed_size": bool(pm) and pm.failed_alloc_bytes == want,
            "phase": pm and pm.phase.value, "requests": pm and list(pm.requests_in_flight),
            "largest_free_block_bytes": pm and pm.largest_free_block_bytes,
            "external_fragmentation_ratio": pm and pm.external_fragmentation_ratio,
            "top_holders": pm and [h.size_bytes for h in pm.top_holders],
            "driver_free_bytes": pm and pm.driver_free_bytes,
            "limit_bytes": pm and pm.device_total_bytes}


def history_oom(out: Path) -> dict[str, Any]:
    """With history on and a snapshot directory: holders carry their phase, the pickle is kept."""
    import tempfile

    snap_dir = tempfile.mkdtemp(prefix="vramscope-oom-")
    sink = ListSink()
    inst.install(config(hooks={"history": "python", "snapshot_dir": snap_dir,
                               "postmortem_min_interval_s": 0.0}), sink=sink)
    torch.cuda.empty_cache()
    with ph.phase("decode"):
        held = [torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda") for _ in range(4)]
    limit = torch.cuda.memory_reserved(0) + 1 * GiB
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(limit / total, 0)
    t0 = time.perf_counter()
    try:
        with ph.phase("prefill", request_id="big-2"):
            torch.empty(4 * GiB, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        pass
    finally:
        oom_s = time.perf_counter() - t0
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        inst.uninstall()
    del held
    pms = sink.postmortems()
    pm = pms[0] if pms else None
    return {"postmortems": len(pms), "oom_to_exception_s": round(oom_s, 4),
            "holders": pm and [[h.size_bytes, h.phase.value if h.phase else None,
                                list(h.frames[:2])] for h in pm.top_holders[:6]],
            "snapshot_path": pm and pm.snapshot_path,
            "snapshot_bytes": pm and pm.snapshot_path and os.path.getsize(pm.snapshot_path)}


def metadata_probe() -> dict[str, Any]:
    """Where this torch keeps ``_set_memory_metadata`` in a snapshot (block and trace entry)."""
    record = torch.cuda.memory._record_memory_history
    record(enabled="all", context="all", stacks="python", max_entries=1000)
    try:
        torch._C._cuda_setMemoryMetadata("vramscope.phase=decode")
        x = torch.empty(8 * 2**20, dtype=torch.uint8, device="cuda")
        torch._C._cuda_setMemoryMetadata("")
        snap = torch.cuda.memory._snapshot()
        light = torch.cuda.memory_snapshot()
    finally:
        record(enabled=None)
    def strip(d: dict) -> dict:
        return {k: v for k, v in d.items() if k != "frames"}
    block = [strip(b) for s in snap["segments"] for b in s["blocks"]
             if b["address"] == x.data_ptr()]
    light_block = [strip(b) for s in light for b in s["blocks"] if b["address"] == x.data_ptr()]
    entries = [strip(e) for t in snap["device_traces"] for e in t
               if e.get("addr") == x.data_ptr()]
    return {"block": block, "light_block": light_block, "trace_entries": entries[-2:]}


def main(out: Path, quick: bool, only: set[str] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"env": env()}

    def section(name: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        if only and name not in only:
            return
        t0 = time.perf_counter()
        try:
            results[name] = fn(*args, **kwargs)
        except Exception:
            results[name] = {"error": traceback.format_exc()}
        results.setdefault("section_seconds", {})[name] = round(time.perf_counter() - t0, 2)
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        print(f"== {name}: {json.dumps(results[name], default=str)[:1500]}", flush=True)

    torch.cuda.init()
    section("read_cost", bench.measure_read_cost, torch, rounds=30, calls=2000)
    (out / "cuda_memory_stats_nested.json").write_text(json.dumps(
        {"comment": "torch._C._cuda_memoryStats(0) on the H200", "stats":
         torch._C._cuda_memoryStats(0)}, indent=1))
    section("metadata_probe", metadata_probe)
    big_sections = {"exactness", "peaks_prefill_heavy", "peaks_decode_heavy",
                    "peaks_reset_mode", "generate_batch", "overhead"}
    if not only or only & big_sections:
        big = bench.build_llama(torch, layers=4 if quick else 16, hidden=512 if quick else 2048)
        section("exactness", exactness, big)
        section("peaks_prefill_heavy", peaks, big, 16, 1024, 8, False)
        section("peaks_decode_heavy", peaks, big, 16, 16, 200, False)
        section("peaks_reset_mode", peaks, big, 16, 1024, 8, True)
        section("generate_batch", generate_batch, big)
        section("overhead", bench.measure_decode_overhead, torch, quick=quick, model=big,
                rounds=6 if quick else 24)
        del big
        torch.cuda.empty_cache()
    small = bench.build_llama(torch, layers=8, hidden=1024)
    section("traces", traces, small, out, quick)
    section("oom_trace", oom_trace, small, out)
    section("direct_oom", direct_oom, out)
    section("history_oom", history_oom, out)
    results["figures"] = _figures(results)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))


def _figures(results: dict[str, Any]) -> list[dict[str, Any]]:
    figs = []
    for name, fn in (("read_cost", bench.read_cost_figures),
                     ("overhead", bench.overhead_figures)):
        if "error" not in results.get(name, {"error": 1}):
            figs += [f.to_json() for f in fn(results[name])]
    return figs


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    only = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--only=")), None)
    main(Path(sys.argv[1]), "--quick" in sys.argv, set(only.split(",")) if only else None)
