#!/usr/bin/env bash
# Two continuous-batching servers on one GPU, recorded THROUGH A RUNNING AGENT with the DEFAULT
# settings (issue 31's GPU check: the leaking pid named on every surface): `vramscope agent` as
# a sidecar, each server (tests/gpu/cb_server.py) with vramscope.install() +
# attach_transformers sending to its socket.
#   A) cb-leak: from 60 s on, every 150th finished request's KV blocks are lost (its block
#      tables dropped, its blocks never freed): the pool's own check reports them orphaned;
#   B) cb-healthy: the same load, nothing lost.
# With SCENARIO "slow-leak" (issue 30's GPU check: a floor trend, not the pool's check), both
# servers are never idle (8 requests open at all times) and A keeps a 2 MiB tensor every 6 s
# from 60 s on (350 kB/s, 0.84 %/h of an H200) while its KV pool loses nothing.
#   tests/gpu/record_cb_pair.sh start DIR DURATION_S [orphans|slow-leak]  # in background
#   tests/gpu/record_cb_pair.sh snapshot DIR OUT       # a copy of the agent's store so far
#   tests/gpu/record_cb_pair.sh finish DIR OUT         # wait, stop the agent, copy to OUT
# On the GPU machine with .whl carried (../shared/tools/gpu-wheels.sh orjson); the agent is
# started and stopped by tests/gpu/sidecar.sh.
set -euo pipefail
MODE=$1 DIR=$2
# shellcheck source=tests/gpu/sidecar.sh
. "$(dirname "$0")/sidecar.sh"  # now in the repository root, the carried wheels on the path
case "$MODE" in
start)
  DURATION_S=$3 SCENARIO=${4:-orphans}
  case "$SCENARIO" in
  orphans) LEAK="--leak-every 150" HEALTHY="" ;;
  slow-leak) LEAK="--never-idle --keep-bytes 2097152 --keep-every-s 6"
             HEALTHY="--never-idle" ;;
  *) echo "unknown scenario $SCENARIO"; exit 2 ;;
  esac
  sidecar_start "$DIR"
  for spec in "cb-leak 0" "cb-healthy 1"; do
    set -- $spec
    if [ "$1" = cb-leak ]; then ARGS=$LEAK; else ARGS=$HEALTHY; fi
    # shellcheck disable=SC2086 # ARGS: several options
    setsid nohup python3 tests/gpu/cb_server.py --device "${VRAMSCOPE_GPU_DEVICE:-cuda}" \
      --duration-s "$DURATION_S" $ARGS --leak-start-s 60 --seed "$2" \
      --agent-socket "$DIR/sock/agent.sock" --out "$DIR/$1.json" > "$DIR/$1.log" 2>&1 \
      < /dev/null &
    echo $! >> "$DIR/server.pids"
  done
  echo "agent $(cat "$DIR/agent.pid"), servers $(tr '\n' ' ' < "$DIR/server.pids")"
  ;;
snapshot)  # the lease may end before finish: what was recorded so far comes back anyway
  OUT=$3
  python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
    "$DIR/agent.db" "$DIR/snapshot.db"
  gzip -c "$DIR/snapshot.db" > "$OUT/gpu_cb_pair.snapshot.db.gz"
  for n in cb-leak cb-healthy; do tail -n 2 "$DIR/$n.log"; done
  tail -n 5 "$DIR/agent.log"
  ;;
finish)
  OUT=$3
  sidecar_finish "$DIR"
  for n in cb-leak cb-healthy; do
    tail -n 4 "$DIR/$n.log"
    cp "$DIR/$n.json" "$OUT/$n.json" || true
    tail -n 40 "$DIR/$n.log" > "$OUT/$n.log"
  done
  gzip -c "$DIR/agent.db" > "$OUT/gpu_cb_pair.db.gz"
  tail -n 50 "$DIR/agent.log" > "$OUT/gpu_cb_pair_agent.log"
  ls -la "$OUT"
  ;;
esac
