#!/usr/bin/env bash
# Two continuous-batching servers on one GPU, recorded THROUGH A RUNNING AGENT with the DEFAULT
# settings (issue 31's GPU check: the leaking pid named on every surface): `vramscope agent` as
# a sidecar, each server (tests/gpu/cb_server.py) with vramscope.install() +
# attach_transformers sending to its socket.
#   A) cb-leak: from 60 s on, every 150th finished request's KV blocks are lost (its block
#      tables dropped, its blocks never freed): the pool's own check reports them orphaned;
#   B) cb-healthy: the same load, nothing lost.
#   tests/gpu/record_cb_pair.sh start DIR DURATION_S   # agent + both servers, in background
#   tests/gpu/record_cb_pair.sh finish DIR OUT         # wait, stop the agent, copy to OUT
# On the GPU machine with .whl carried (../shared/tools/gpu-wheels.sh).
set -euo pipefail
MODE=$1 DIR=$2
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
if [ ! -d /tmp/site/sqlalchemy ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$REPO" PYTHONUNBUFFERED=1
case "$MODE" in
start)
  DURATION_S=$3
  mkdir -p "$DIR/sock" && chmod 700 "$DIR/sock"
  cat > "$DIR/agent.toml" <<TOML
[agent]
socket_path = "$DIR/sock/agent.sock"

[database]
url = "sqlite:///$DIR/agent.db"
TOML
  setsid nohup python3 -m vramscope agent --config "$DIR/agent.toml" \
    > "$DIR/agent.log" 2>&1 < /dev/null &
  echo $! > "$DIR/agent.pid"
  for _ in $(seq 60); do [ -S "$DIR/sock/agent.sock" ] && break; sleep 0.5; done
  [ -S "$DIR/sock/agent.sock" ] || { echo "agent did not start"; cat "$DIR/agent.log"; exit 1; }
  for spec in "cb-leak 150 0" "cb-healthy 0 1"; do
    set -- $spec
    setsid nohup python3 tests/gpu/cb_server.py --device cuda --duration-s "$DURATION_S" \
      --leak-every "$2" --leak-start-s 60 --seed "$3" --agent-socket "$DIR/sock/agent.sock" \
      --out "$DIR/$1.json" > "$DIR/$1.log" 2>&1 < /dev/null &
    echo $! >> "$DIR/server.pids"
  done
  echo "agent $(cat "$DIR/agent.pid"), servers $(tr '\n' ' ' < "$DIR/server.pids")"
  ;;
finish)
  OUT=$3
  for pid in $(cat "$DIR/server.pids"); do
    while kill -0 "$pid" 2>/dev/null; do sleep 2; done
  done
  sleep 3
  kill -TERM "$(cat "$DIR/agent.pid")" || true
  while kill -0 "$(cat "$DIR/agent.pid")" 2>/dev/null; do sleep 1; done
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
