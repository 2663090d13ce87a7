#!/usr/bin/env bash
# Two inference servers on one GPU, recorded THROUGH A RUNNING AGENT (the product as a user runs
# it: `vramscope agent` as a sidecar, each server with vramscope.install() + attach_transformers
# sending to its socket), for the "one answer" check (docs/gpu-verification.md):
#   A) pair-leak: never idle, a 2 MiB tensor kept every 17th request from 60 s on (~0.8 %/h of
#      an H200), B) pair-healthy: the same load, no leak.
# Each server also writes its trace (<name>.jsonl + .truth.json) for `vramscope analyze FILE`.
# The agent's config shortens the leak warm-up and minimum span (5 and 10 min, both documented
# settings) so that a verdict fits the GPU lease; the defaults need 35 min of floor.
#   tests/gpu/record_agent_pair.sh start DIR DURATION_S   # agent + both servers, in background
#   tests/gpu/record_agent_pair.sh finish DIR OUT         # wait, stop the agent, copy to OUT
# On the GPU machine with .whl carried (../shared/tools/gpu-wheels.sh orjson); the agent is
# started and stopped by tests/gpu/sidecar.sh.
set -euo pipefail
MODE=$1 DIR=$2
# shellcheck source=tests/gpu/sidecar.sh
. "$(dirname "$0")/sidecar.sh"  # now in the repository root, the carried wheels on the path
case "$MODE" in
start)
  DURATION_S=$3
  sidecar_start "$DIR" "
[alerts]
leak_warmup_s = 300
leak_min_span_s = 600"
  for spec in "pair-leak 60 11" "pair-healthy 1e9 22"; do
    set -- $spec
    setsid nohup python3 tests/gpu/record_serving.py --scenario never_idle --device cuda \
      --duration-s "$DURATION_S" --leak-start-s "$2" --leak-every 17 --leak-bytes 2097152 \
      --seed "$3" --threads 4 --agent-socket "$DIR/sock/agent.sock" --out "$DIR/$1.jsonl" \
      > "$DIR/$1.log" 2>&1 < /dev/null &
    echo $! >> "$DIR/server.pids"
  done
  echo "agent $(cat "$DIR/agent.pid"), servers $(cat "$DIR/server.pids" | tr '\n' ' ')"
  ;;
finish)
  OUT=$3
  sidecar_finish "$DIR"
  for f in "$DIR"/pair-*.log; do tail -n 3 "$f"; done
  gzip -c "$DIR/agent.db" > "$OUT/gpu_agent_pair.db.gz"
  for n in pair-leak pair-healthy; do
    gzip -c "$DIR/$n.jsonl" > "$OUT/gpu_agent_$n.jsonl.gz"
    cp "$DIR/$n.jsonl.truth.json" "$OUT/gpu_agent_$n.truth.json"
  done
  tail -n 50 "$DIR/agent.log" > "$OUT/gpu_agent_pair.log"
  ls -la "$OUT"
  ;;
esac
