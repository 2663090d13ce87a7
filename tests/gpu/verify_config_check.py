"""The [server] configuration check with real NVML: the agent's start-up log and the
``config_oom`` alert, on the GPU machine.

    python3 tests/gpu/verify_config_check.py --out $OUT/config_check.json
    python3 tests/gpu/verify_config_check.py --fake-devices 1 --out /tmp/cc.json   # a dry run

For two configurations of a Llama-3-8B shape (a config.json written here, no weights, no hub)
beside a vLLM-like preallocated 105 GiB KV pool (gpu_memory_utilization 0.9): 16 x 16,000-token
prompts prefilled whole (cannot fit in an H200's 139.8 GiB) and the same with chunked prefill of
8,192 tokens (fits),
it runs ``vramscope agent`` as a user would (real NVML, a fresh SQLite database) for a few
seconds, stops it with SIGTERM, and records: the agent's "config check" log lines, the alerts
stored, and what ``vramscope analyze --db`` prints for the check. Writes one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "vocab_size": 128256, "head_dim": 128,
             "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
CASES = {"whole_prompts": {"max_model_len": 16000, "max_num_seqs": 16, "kv_pool_gib": 105.0},
         "chunked_8192": {"max_model_len": 16000, "max_num_seqs": 16, "kv_pool_gib": 105.0,
                          "max_num_batched_tokens": 8192}}


def run_case(name: str, limits: dict[str, Any], work: Path, fake_devices: int,
             seconds: float) -> dict[str, Any]:
    folder = work / name
    folder.mkdir(mode=0o700)  # the agent wants a private folder for its socket
    (folder / "config.json").write_text(json.dumps(LLAMA3_8B))
    lines = [f'model = "{folder / "config.json"}"'] + [f"{k} = {v}" for k, v in limits.items()]
    toml = folder / "vramscope.toml"
    toml.write_text("[server]\n" + "\n".join(lines) + "\n")
    db = f"sqlite:///{folder / 'vs.db'}"
    cmd = [sys.executable, "-m", "vramscope", "agent", "--config", str(toml), "--db", db,
           "--socket", str(folder / "s.sock")]
    if fake_devices:
        cmd += ["--fake-devices", str(fake_devices)]
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(seconds)
    agent.send_signal(signal.SIGTERM)
    log, _ = agent.communicate(timeout=60)
    analyzed = subprocess.run([sys.executable, "-m", "vramscope", "analyze", "--db", db,
                               "--config", str(toml), "--json"],
                              capture_output=True, text=True, timeout=120)
    doc = json.loads(analyzed.stdout) if analyzed.returncode == 0 else None
    return {"limits": limits, "agent_rc": agent.returncode, "agent_log_tail": log[-1500:],
            "config_check_log": [ln for ln in log.splitlines() if "config check" in ln],
            "analyze_rc": analyzed.returncode, "analyze_stderr": analyzed.stderr[-2000:],
            "alerts": [{k: a.get(k) for k in ("rule", "severity", "device", "message")}
                       for a in (doc or {}).get("alerts", [])],
            "config_check": {dev: d.get("config_check")
                             for dev, d in (doc or {}).get("devices", {}).items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--fake-devices", type=int, default=0, help="no GPU: simulated devices")
    p.add_argument("--seconds", type=float, default=6.0, help="how long each agent runs")
    args = p.parse_args()
    out: dict[str, Any] = {"cases": {}}
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out["nvml"] = {"name": pynvml.nvmlDeviceGetName(h),
                       "total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total)}
    except Exception as exc:  # noqa: BLE001 - a dry run without a GPU
        out["nvml"] = {"error": repr(exc)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, limits in CASES.items():
            out["cases"][name] = run_case(name, limits, Path(tmp), args.fake_devices,
                                          args.seconds)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
