#!/usr/bin/env bash
# Every `gpu` test and the GPU-side checks in one pass on the GPU machine (one H200), writing
# logs and recorded traces under $OUT. Run from the repo root with .whl carried:
#   tests/gpu/lead_run.sh tests     # the gpu-marked tests + the allocator-model check
#   tests/gpu/lead_run.sh bench [NAMES...]   # vramscope bench --json, GPU benchmarks included;
#                                            # names split the suite over two 10-minute calls
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
MODE=${1:-tests}
shift || true
case "$MODE" in
tests)
  VRAMSCOPE_TRACE_OUT=$OUT/kv_generate_batch_trace.jsonl timeout 200 python3 -m pytest -m gpu -s \
    -p no:cacheprovider tests/gpu/test_kvpool_gpu.py 2>&1 | tee "$OUT/kvpool_gpu.log" | tail -25
  timeout 150 python3 -m pytest -m gpu -s -p no:cacheprovider tests/gpu/test_agent_gpu.py \
    2>&1 | tee "$OUT/agent_gpu.log" | tail -25
  timeout 120 python3 -m tools.sim.gpu_check --out "$OUT/gpu_allocator_check.jsonl" \
    2>&1 | tee "$OUT/sim_gpu_check.log" | tail -8
  timeout 200 python3 -m pytest -m gpu -s -p no:cacheprovider tests/agent/test_sim_gpu_allocator.py \
    tests/agent/test_demo.py tests/gpu/test_hooks_gpu.py 2>&1 | tee "$OUT/other_gpu.log" | tail -25
  ;;
bench)
  TAG=$(IFS=-; echo "${*:-all}")
  SECONDS=0
  timeout 560 python3 -m vramscope bench --json "$@" \
    > "$OUT/bench_gpu_$TAG.json" 2> "$OUT/bench_gpu_$TAG.err"
  echo "rc=$? wall=${SECONDS}s"; tail -5 "$OUT/bench_gpu_$TAG.err"
  python3 - "$OUT/bench_gpu_$TAG.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for f in doc["figures"]:
    print(f"{f['bench']:10} {f['metric'][:44]:44} {f['value']:>12.5g} {f['unit']:10} {f['target']:>10} {f['met']}")
print("skipped:", doc["skipped"])
PY
  ;;
esac
