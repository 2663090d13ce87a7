"""Tables in docs/gpu-verification.md rendered from the raw JSON the GPU scripts wrote.

    python -m tests.support.gpu_docs            # rewrite the generated blocks in place

Each block sits between ``<!-- gpu:NAME -->`` and ``<!-- /gpu:NAME -->``; ``tests/test_docs.py``
fails when a block differs from what its JSON renders, so no figure there is typed by hand.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "gpu-verification.md"
RUNS = ROOT / "docs" / "gpu-runs"
MIB = 2**20


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / MIB:,.1f}"


def render_ab(doc: dict[str, Any]) -> str:
    """The generate_batch A/B: the floor after each call without and with the integration."""
    a = doc["args"]
    rows = ["| call | floor step without (MiB) | floor step with (MiB) | difference (bytes) "
            "| pool blocks without | pool blocks with |", "|---|---|---|---|---|---|"]
    steps = zip(doc["floor_steps_without_bytes"], doc["floor_steps_with_bytes"],
                doc["step_differences_bytes"], doc["pool_blocks_without"],
                doc["pool_blocks_with"])
    for i, (wo, w, diff, pa, pb) in enumerate(steps, 1):
        rows.append(f"| {i} | {_mib(wo)} | {_mib(w)} | {diff:,} | {pa:,} | {pb:,} |")
    checks = ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in doc["checks"].items())
    v = doc["versions"]
    head = (f"{v['device']}, torch {v['torch']}, transformers {v['transformers']}: "
            f"{a['calls']} `generate_batch` calls of {a['requests']} requests "
            f"({a['prompt']} prompt + {a['new_tokens']} new tokens) on a random-weight Llama "
            f"({a['layers']} layers, hidden {a['hidden']}, {a['kv_heads']} KV heads), first "
            f"without vramscope, then after `vramscope.install()` + "
            f"`vramscope.attach_transformers(model)` in the same process. Largest difference "
            f"between the floor steps: **{doc['max_abs_step_difference_bytes']:,} bytes** "
            f"(bound: 1 MiB per call). Checks: {checks}.")
    return head + "\n\n" + "\n".join(rows)


def render_identity(doc: dict[str, Any]) -> str:
    """Device identity: each check of tests/gpu/verify_identity.py with its numbers."""
    rows = ["| check | result | detail |", "|---|---|---|"]
    for c in doc["checks"]:
        detail = c["detail"]
        if isinstance(detail, dict):
            detail = ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}"
                               for k, v in detail.items() if not isinstance(v, (list, dict)))
        rows.append(f"| {c['check']} | {'pass' if c['ok'] else 'FAIL'} | {detail} |")
    servers = "; ".join(f"`{s['name']}` (pid {s['pid']}, CUDA_VISIBLE_DEVICES="
                        f"{s['cuda_visible_devices'] or 'unset'}) reserved "
                        f"{s['reserved_bytes']:,} bytes, torch UUID {s['torch_uuid']}"
                        for s in doc["servers"].values())
    nvml = doc["nvml"]["after"]
    head = (f"Servers: {servers}. NVML at the check: used {nvml['used_bytes']:,} of "
            f"{nvml['total_bytes']:,} bytes on {nvml['uuid']}.")
    return head + "\n\n" + "\n".join(rows)


def render_recordings(truths: dict[str, Any]) -> str:
    """The serving recordings of tests/gpu/record_serving.py, from their truth files."""
    rows = ["| recording | scenario | length | requests | clients | leak | leaked | errors | "
            "allocated at the end |", "|---|---|---|---|---|---|---|---|---|"]
    for name, t in truths.items():
        a, leak = t["args"], t["leak"]
        how = (f"{leak['bytes_per_s'] / 1000:,.0f} kB/s from {leak['start_ts'] - t['t0']:.0f} s"
               if leak["present"] else "none")
        leaked = f"{leak['bytes_total'] / MIB:,.0f} MiB" if leak["present"] else "—"
        clients = a["threads"] if t["scenario"] == "never_idle" else 1
        rows.append(f"| `{name}` | {t['scenario']} | {t['duration_s']:,.0f} s | "
                    f"{t['requests_served']:,} | {clients} | {how} | {leaked} | "
                    f"{len(t['errors'])} | {_mib(t['allocator_end']['allocated_bytes'])} MiB |")
    # one line per machine and software the recordings were made with (H200 and H100 runs)
    made: dict[str, list[str]] = {}
    for name, t in truths.items():
        v = t["versions"]
        made.setdefault(f"{v['device']}, torch {v['torch']}, transformers {v['transformers']}, "
                        f"Python {v['python']}", []).append(f"`{name}`")
    heads = [f"{k}: {', '.join(names)}." if len(made) > 1 else f"{k}."
             for k, names in made.items()]
    return "\n".join(heads) + "\n\n" + "\n".join(rows)


def render_config_check(doc: dict[str, Any]) -> str:
    """The [server] check through a real agent with real NVML (verify_config_check.py)."""
    nvml = doc["nvml"]
    rows = ["| configuration | agent's start-up log | alerts stored | analyze: fits |",
            "|---|---|---|---|"]
    for name, c in doc["cases"].items():
        limits = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                           for k, v in c["limits"].items())
        log = " ".join(line.split(" config check, ", 1)[-1] for line in c["config_check_log"])
        fits = ", ".join(f"device {d}: {'yes' if v and v['fits'] else 'no'}"
                         for d, v in c["config_check"].items())
        alerts = ", ".join(a["rule"] for a in c["alerts"]) or "none"
        rows.append(f"| `{name}`: {limits} | {log} | {alerts} | {fits} |")
    return (f"{nvml['name']}, NVML total {nvml['total_bytes']:,} bytes.\n\n" + "\n".join(rows))


def _truth_files() -> dict[str, Any]:
    data = ROOT / "tests" / "data"
    out = {}
    for p in sorted(data.glob("*.truth.json")):
        trace = p.name[:-len(".truth.json")]
        name = trace if (data / trace).exists() else trace + ".gz"  # long ones are compressed
        out[name] = json.loads(p.read_text())
    return out


def render_one_answer(doc: dict[str, Any]) -> str:
    """Each surface's answer per process on the agent-recorded pair (one_answer_check.py)."""
    names = doc["processes"]
    rows = ["| surface | " + " | ".join(f"{names[str(a[0])]} (pid {a[0]})" for a in doc["live"])
            + " |", "|---|" + "---|" * len(doc["live"])]

    def cell(a: list[Any]) -> str:
        state, slope, first, risk = a[1], a[2], a[3], a[4]
        if state == "leak" and not slope:  # the KV pool's orphaned blocks: no trend needed
            leak = f"leak (orphaned KV blocks) from {first:.0f}"
        elif state == "leak":
            leak = f"leak {slope * 3600 / MIB:,.1f} MiB/h from {first:.0f}"
        else:
            leak = state.replace("_", " ")
        return f"{leak}; risk {risk}"

    for label, answers in [("live agent (stored verdicts)", doc["live"]),
                           *doc["surfaces"].items()]:
        rows.append(f"| {label} | " + " | ".join(cell(a) for a in answers) + " |")
    same = "yes" if doc["same_everywhere"] else "NO"
    return ("\n".join(rows) + f"\n\nSame answer on every surface: **{same}** "
            f"({doc['span_s'] / 60:.1f} min recorded, {doc['verdict_rows']} verdict rows).")


def render_slow_leak(doc: dict[str, Any], run: Path) -> str:
    """Issue 30's GPU check (record_cb_pair.sh slow-leak): the truth from the servers' own
    summaries (in ``run``) beside what the agent said as it ran, then every surface now."""
    leak = json.loads((run / "cb-leak.json").read_text())
    healthy = json.loads((run / "cb-healthy.json").read_text())
    size = leak["kept_bytes"] // leak["kept_tensors"]
    truth = (leak["kept_tensors"] - 1) * size / (leak["last_kept_ts"] - leak["first_kept_ts"])
    starts = {leak["pid"]: leak["t0"], healthy["pid"]: healthy["t0"]}
    lines = [
        f"Truth: pid {leak['pid']} kept {leak['kept_tensors']} tensors of {size / MIB:g} MiB "
        f"from {leak['first_kept_ts'] - leak['t0']:.0f} s to "
        f"{leak['last_kept_ts'] - leak['t0']:.0f} s after its start: **{truth:,.0f} bytes/s** "
        f"({truth * 3600 / 2**30:.2f} GiB/h); pid {healthy['pid']} kept nothing. Served: "
        f"{leak['served']:,} and {healthy['served']:,} requests, "
        f"{leak['errors'] + healthy['errors']} errors, {leak['duration_s'] / 60:.1f} min each.",
        "",
        "| pid | the agent's stored verdicts as it ran (seconds after the server's start) |",
        "|---|---|"]
    for pid, start in sorted(starts.items()):
        seen, cells = None, []
        for p, ts, state, slope, risk in doc["history"]:
            if p != pid or (state, risk) == seen:
                continue
            seen = (state, risk)
            ratio = f" {slope:,.0f} bytes/s ({slope / truth:.3f}x the truth)" if slope else ""
            cells.append(f"{round(doc['first_ts'] + ts - start)} s: "
                         f"{state.replace('_', ' ')}{ratio}, risk {risk}")
        lines.append(f"| {pid} | " + "; ".join(cells) + " |")
    alerts = "; ".join(f"`{rule}` ({severity}) at {doc['first_ts'] + fired - leak['t0']:.0f} s: "
                       f"\"{message}\"" for rule, severity, fired, _, message in doc["alerts"])
    lines += ["", f"Alerts the agent raised: {alerts or 'none'}.", "", render_one_answer(doc)]
    return "\n".join(lines)


def _interval(xs: list[float | None], unit: str) -> str:
    x, lo, hi = xs
    return "none" if x is None else f"{x:g} {unit} ({lo:g}–{hi:g})"


def _whose(pid: int | None) -> str:
    return "the device's (no pid)" if pid is None else f"pid {pid}'s"


def render_growth_live(doc: dict[str, Any]) -> str:
    """Growth to a real OOM through a running agent (tests/gpu/live_growth_figures.py's
    figures.json): what the agent stored, against the servers' own truth."""
    leak = doc["first_leak"]
    true_mb = doc["true_rate_mb_s"]
    rows = [f"{doc['card']}. Grower pid {doc['grower']}: onset {doc['onset_after_t0_s']:g} s "
            f"after its model loaded, torch OOM {doc['oom_after_onset_s']:g} s after the onset; "
            f"true rate {true_mb:g} MB/s ({true_mb * 1e6 * 3600 / 2**30:.1f} GiB/h, its kept "
            f"tensors over their span). Healthy pids {doc['healthy'][0]}, then "
            f"{doc['healthy'][1]} (restarted). Seconds after the onset / before the OOM.", "",
            "| stored by the agent | after onset | before OOM | figure | truth |",
            "|---|---|---|---|---|",
            f"| first `leak` verdict, pid {doc['grower']} | {leak['after_onset_s']:g} | "
            f"{leak['before_oom_s']:g} | rate {_interval(leak['rate_mb_s'], 'MB/s')}; time to "
            f"OOM {_interval(leak['time_to_oom_s'], 's')} | {true_mb:g} MB/s; "
            f"{leak['before_oom_s']:g} s |"]
    for r in doc["risk_before_oom"]:
        rows.append(f"| risk `{r['level']}`, cause `{r['cause']}` | {r['after_onset_s']:g} | "
                    f"{r['before_oom_s']:g} | time to OOM {_interval(r['time_to_oom_s'], 's')} "
                    f"(leak's: {_interval(r['leak_time_to_oom_s'], 's')}) | "
                    f"{r['before_oom_s']:g} s |")
    for rule, fired, resolved, message in doc["alerts"]:
        cause = message.split("; likely ")[1].split(";")[0] if "; likely " in message else "—"
        end = ("still firing" if resolved is None  # + 0.0: no "-0" for resolved at the OOM
               else f"resolved {0.0 - resolved + 0.0:g} s after the OOM")
        rows.append(f"| alert `{rule}` (likely: {cause}) | "
                    f"{doc['oom_after_onset_s'] - fired:.1f} | {fired:g} | {end} | |")
    after = "; ".join(f"+{t:g} s {leak_state}/{level}" + (f" ({cause})" if cause else "")
                      + (" ended" if ended else "")
                      for t, leak_state, level, cause, ended in doc["after_oom"])
    healthy = "; ".join(f"pid {pid} `{level}` {before:g} s before the OOM, cause `{cause}`, "
                        f"reasons {', '.join(reasons)}, headroom {head:g} GiB"
                        for pid, before, level, cause, reasons, head in doc["healthy_risk"])
    ended = ", ".join(f"pid {pid} {s:g} s after its exit" if s >= 0 else  # process_exit: sent
                      f"pid {pid} {-s:g} s before its exit was seen"  # before the teardown
                      for pid, s in doc["ended"])
    at_risk = ", ".join(f"pid {pid} from pid {grower}"
                        for pid, grower in doc.get("healthy_at_risk_from", []))
    rows += ["", f"- The grower's rows from its OOM on (leak state/risk level): {after}.",
             f"- Healthy pids' leak states: {', '.join(doc['healthy_leak_states'])}; risk "
             f"other than ok: {healthy or 'none'}.",
             f"- Stored \"at risk from pid N's growth\" on a healthy pid: "
             f"{at_risk or 'none'}.",
             f"- `ended` rows: {ended or 'none'}.",
             f"- OOM cause: post-mortem (`complete_postmortem`) "
             f"{', '.join(doc['postmortem_causes'])}; `analyze --db` {doc['analyze_oom_cause']}.",
             f"- `analyze --db --json` after the run: the device's leak answer is "
             f"{_whose(doc['analyze_leak'][0])}, `{doc['analyze_leak'][1]}`; the grower's line: "
             f"leak "
             f"`{doc['analyze_grower'][0]}`, risk `{doc['analyze_grower'][1]}`, ended "
             f"{str(doc['analyze_grower'][2]).lower()}."]
    return "\n".join(rows)


def slow_leak_block(run: str) -> tuple[str, Callable[[dict[str, Any]], str]]:
    """A slow-leak recording's block: its one_answer.json, rendered with its folder's truth."""
    return f"{run}/one_answer.json", partial(render_slow_leak, run=RUNS / run)


BLOCKS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "ab_generate_batch": ("2026-12-02/ab_generate_batch_results.json", render_ab),
    "identity": ("2026-12-02/identity_results.json", render_identity),
    "recordings": ("../../tests/data/*.truth.json", render_recordings),
    "config_check": ("2026-12-02b/config_check.json", render_config_check),
    "one_answer": ("2026-12-04b/one_answer.json", render_one_answer),
    "one_answer_cb": ("2026-12-04d/one_answer.json", render_one_answer),
    "slow_leak": slow_leak_block("2026-12-05"),
    "slow_leak_b": slow_leak_block("2026-12-05b"),
    "slow_leak_c": slow_leak_block("2026-12-05c"),
    "growth_live": ("2026-12-07/live/figures.json", render_growth_live),
    "growth_live_today": ("2026-12-06/live/today/figures.json", render_growth_live),
}


def render_blocks(text: str) -> str:
    for name, (source, render) in BLOCKS.items():
        doc = _truth_files() if "*" in source else json.loads((RUNS / source).read_text())
        body = render(doc)
        pattern = re.compile(rf"(<!-- gpu:{name} -->\n)(?:.*?\n)?(<!-- /gpu:{name} -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"docs/gpu-verification.md has no <!-- gpu:{name} --> block")
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    return text


if __name__ == "__main__":
    DOC.write_text(render_blocks(DOC.read_text()))
    sys.exit(0)
