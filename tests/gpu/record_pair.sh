#!/usr/bin/env bash
# Two inference servers on one GPU at the same time, each its own process through the product's
# hooks (tests/gpu/record_serving.py, scenario never_idle), started together in the background:
#   A) gpu_pair_leak.jsonl: a slow leak from 60 s on (a 2 MiB tensor kept every 17th request,
#      ~0.8 % of an H200's memory per hour at ~2.8 requests/s);
#   B) gpu_pair_healthy.jsonl: the same load, another seed, no leak (--leak-start-s 1e9).
# Each writes <trace>, <trace>.truth.json and a log under DIR; the pids are printed and kept in
# DIR/pids. Both stop by themselves after DURATION_S. Run from the repo root:
#   tests/gpu/record_pair.sh [DIR=/tmp/pair] [DURATION_S=1380] [DEVICE=cuda]
# On the GPU machine nothing needs installing: PYTHONPATH=repo root, as for verify_hooks.py.
set -euo pipefail
DIR=${1:-/tmp/pair}
DURATION_S=${2:-1380}
DEVICE=${3:-cuda}
PY=${PYTHON:-python3}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$DIR"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$REPO"
setsid nohup "$PY" tests/gpu/record_serving.py --scenario never_idle --device "$DEVICE" \
  --duration-s "$DURATION_S" --leak-start-s 60 --leak-every 17 --leak-bytes 2097152 \
  --seed 11 --threads 4 --out "$DIR/gpu_pair_leak.jsonl" \
  > "$DIR/record_pair_leak.log" 2>&1 < /dev/null &
PID_A=$!
setsid nohup "$PY" tests/gpu/record_serving.py --scenario never_idle --device "$DEVICE" \
  --duration-s "$DURATION_S" --leak-start-s 1e9 \
  --seed 22 --threads 4 --out "$DIR/gpu_pair_healthy.jsonl" \
  > "$DIR/record_pair_healthy.log" 2>&1 < /dev/null &
PID_B=$!
echo "$PID_A $PID_B" > "$DIR/pids"
echo "leak (A) pid $PID_A, healthy (B) pid $PID_B, dir $DIR, ${DURATION_S} s on $DEVICE"
