"""The ``vramscope.analysis/1`` document as text: the readable report of ``vramscope analyze``.

MiB/GiB and ISO 8601 UTC times appear only here; the JSON document (``report.py``) keeps bytes
and Unix seconds. Kept apart from the document's assembly so that what the terminal shows can
change without touching the public document. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vramscope.agent.analysis.diagnosis import REMEDIES, cause_words
from vramscope.agent.analysis.kv_leak import verdict_words
from vramscope.agent.timefmt import duration, iso_utc


def render_text(doc: Mapping[str, Any]) -> str:
    """The analysis document as text for a terminal (MiB/GiB and ISO 8601 UTC times only
    here; the JSON document keeps bytes and Unix seconds)."""
    lines = []
    for dev, d in doc["devices"].items():
        lines += [f"device {dev}", *_leak_lines(d["leak"]), *_makeup_lines(d["leak"]),
                  *_oom_lines(d["oom"]), *_process_lines(d.get("processes") or []),
                  *_frag_lines(d["fragmentation"]), *_phase_lines(d["phases"]),
                  *_kv_lines(d["kv"]), ""]
    lines.append(f"alerts: {len(doc['alerts'])}")
    for a in doc["alerts"]:
        resolved = ("still firing" if a["resolved_ts"] is None
                    else f"resolved {iso_utc(a['resolved_ts'])}")
        lines.append(f"  {a['severity']:8} {a['rule']:20} device {a['device']} "
                     f"fired {iso_utc(a['fired_ts'])}, {resolved}")
    return "\n".join(lines) + "\n"


def _gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def _leak_lines(leak: Mapping[str, Any]) -> list[str]:
    if leak.get("state") == "insufficient_data":
        return [f"  leak: {leak['evidence']}"]  # "not enough data yet: ... more min of ..."
    if not leak["detected"]:
        return [f"  leak: none ({leak['evidence']})"]
    return [f"  leak: DETECTED at {iso_utc(leak['first_detected_ts'])}, {verdict_words(leak)}",
            f"        {leak['evidence']}"]


def _process_lines(processes: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each process's verdict (``vramscope.verdict/1``), when the device has several."""
    if len(processes) < 2:
        return []
    lines = ["  per process:"]
    for v in processes:
        who = "device (no pid)" if v["pid"] is None else f"pid {v['pid']}"
        if v.get("rank") is not None:
            who = f"rank {v['rank']} ({who})"
        who = v.get("process") or who  # a stored verdict's: the process's name and pid
        if v.get("ended"):
            who += ", ended"
        leak, risk = v["leak"], v["risk"]
        said = {"leak": f"LEAK {verdict_words(leak)} since "
                        f"{iso_utc(leak['first_detected_ts'])}" if leak["first_detected_ts"]
                        else "LEAK",
                "no_leak": "no leak", "insufficient_data": "not enough data yet"}
        cause = cause_words(risk["cause"], risk.get("at_risk_from_pid"))
        lines.append(f"    {who}: {said.get(leak['state'], leak['state'])}; "
                     f"OOM risk {risk['level'] or 'not assessed yet'}"
                     + (f" ({cause})" if cause else ""))
    return lines


def _makeup_lines(leak: Mapping[str, Any]) -> list[str]:
    """The make-up table: what the growth between two idle points is made of."""
    m = leak.get("makeup")
    if m is None:
        return ["  make-up: no two idle-point layouts to compare (memory_layout events)"] \
            if leak["detected"] else []
    lines = [f"  make-up: {m['summary']}"]
    for kind in ("blocks", "segments"):
        for r in m[kind][:8]:
            where = f"  phase {r['phase']}" if r["phase"] else ""
            lines.append(f"    {r['bytes'] / 2**20:>10.1f} MiB  {r['description']}{where}")
            lines += [f"{'':20}at {frame}" for frame in r["stack"][:4]]
    if m["diagnosis"]:
        lines += [f"  diagnosis: {m['diagnosis']}", f"    - {m['remedy']}"]
    if m["incomplete"]:
        lines.append("    (a layout left small groups out: the rows may miss some)")
    return lines


def _oom_lines(oom: Mapping[str, Any]) -> list[str]:
    tto = oom["min_time_to_oom_s"]
    warn = oom["first_warning_ts"]
    out = [f"  OOM risk: max {oom['max_risk']}"
           + ("" if warn is None else f", first warning {iso_utc(warn)}")
           + ("" if tto is None else f", shortest forecast time to OOM {duration(tto)}")]
    if oom.get("unjudged") and warn is None:  # no limit or no measurement (analyze says)
        out = [f"  OOM risk: {oom['unjudged']}"]
    if oom["occurred"]:
        lead = "" if warn is None or warn > oom["first_oom_ts"] \
            else f" (warned {duration(oom['first_oom_ts'] - warn)} before)"
        out.append(f"  OOM at {iso_utc(oom['first_oom_ts'])}{lead}; likely cause: "
                   f"{oom['cause']}")
        out += [f"    - {r}" for r in REMEDIES[oom["cause"]]]
    return out


def _frag_lines(frag: Mapping[str, Any]) -> list[str]:
    ext = frag["max_external_fragmentation"]
    lines = [f"  fragmentation: max inactive split {frag['max_inactive_split_ratio']:.1%}, "
             f"max external {'n/a' if ext is None else f'{ext:.1%}'}"]
    if ext is not None:  # a high share alone is common and harmless: say what would matter
        lines.append("    (external: the share of cached free memory outside the largest free "
                     "block; a risk only when the largest request fits neither that block nor "
                     "new memory, which the OOM-risk line above includes)")
    return lines


def _phase_lines(phases: Mapping[str, Any]) -> list[str]:
    return [f"  {p:8} {v['samples']:>9} samples, peak allocated {_gib(v['peak_allocated_bytes'])}"
            for p, v in phases.items()]


def _kv_lines(kv: Mapping[str, Any]) -> list[str]:
    if kv["blocks_total"] is None:
        return ["  KV pool: not observed"]
    pools = kv.get("pools") or 1
    which = "" if pools == 1 else f" (the fullest of {pools} pools)"
    return [f"  KV pool: peak {kv['peak_blocks_used']} of {kv['blocks_total']} blocks "
            f"({kv['peak_usage_ratio']:.1%}){which}"]
