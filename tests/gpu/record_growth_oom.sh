#!/usr/bin/env bash
# Issue 44's GPU check: growth to a real CUDA OOM, recorded THROUGH A RUNNING AGENT with the
# DEFAULT settings (`vramscope agent` as a sidecar, tests/gpu/sidecar.sh), beside a healthy
# server that is restarted mid-run (a new pid). Both are never-idle continuous-batching servers
# (tests/gpu/cb_server.py, vramscope.install() + attach_transformers sending to the socket):
#   cb-grow:      from 210 s after its start on, keeps a B-byte CUDA tensor every second, B
#                 chosen so the device's free memory is filled in FILL_S (570 s) after that
#                 onset: it ends on a real torch.OutOfMemoryError (the hooks' OOM observer sends
#                 the post-mortem; cb_server frees its memory and exits 3);
#   cb-healthy-1: nothing kept, runs DURATION_S/2, then stops;
#   cb-healthy-2: the same, started at once after it (a new pid), to the end of DURATION_S.
# B = (free memory with the healthy server loaded - one more server's footprint - 512 MiB) /
# FILL_S, from nvidia-smi; KEEP_BYTES overrides it (on CPU it is 1 MiB). GROW_FRACTION=F gives
# the grower torch's per-process limit F of the device and fills that instead: torch raises its
# OutOfMemoryError while the device still has memory (the H100 run without it died of a cuDNN
# failure once the device was full, before any torch OOM). ONSET_S and FILL_S change the timing.
#   tests/gpu/record_growth_oom.sh start DIR DURATION_S    # returns at once; setsid's the rest
#   tests/gpu/record_growth_oom.sh snapshot DIR OUT        # a copy of the agent's store so far
#   tests/gpu/record_growth_oom.sh finish DIR OUT          # wait, stop the agent, copy to OUT
# OUT gets at most 5 files: growth_oom.db.gz (the agent's database), growth_oom_files.tar.gz
# (servers' logs and JSON, agent log and config, meta.json), analyze.json (`vramscope analyze
# --db ... --json`), status.txt. On the GPU machine with .whl carried
# (../shared/tools/gpu-wheels.sh orjson); dry-run on CPU with VRAMSCOPE_GPU_DEVICE=cpu.
set -euo pipefail
MODE=$1 DIR=$2
# shellcheck source=tests/gpu/sidecar.sh
. "$(dirname "$0")/sidecar.sh"  # now in the repository root, the carried wheels on the path
DEVICE=${VRAMSCOPE_GPU_DEVICE:-cuda}
ONSET_S=${ONSET_S:-210} FILL_S=${FILL_S:-570}

free_mib() {  # the device's free memory (MiB); 0 on CPU
  if [ "$DEVICE" = cpu ]; then echo 0; return; fi
  local m
  m=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0 2>/dev/null \
      | head -n 1 | tr -d ' ') || true
  case "$m" in
  ''|*[!0-9]*) python3 -c "import torch; print(torch.cuda.mem_get_info(0)[0] // 1048576)" ;;
  *) echo "$m" ;;
  esac
}

server() {  # NAME SEED DURATION_S [cb_server options...]: runs in the foreground
  local name=$1 seed=$2 dur=$3
  shift 3
  python3 tests/gpu/cb_server.py --device "$DEVICE" --never-idle --duration-s "$dur" \
    --seed "$seed" --agent-socket "$DIR/sock/agent.sock" --out "$DIR/$name.json" "$@" \
    > "$DIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$DIR/$name.pid"
  echo "$(date +%s.%N) $name pid $!" >> "$DIR/timeline.txt"
  local rc=0
  wait $! || rc=$?
  echo "$(date +%s.%N) $name exit $rc" >> "$DIR/timeline.txt"
}

case "$MODE" in
start)
  DURATION_S=$3
  mkdir -p "$DIR"
  sidecar_start "$DIR"
  echo "$(date +%s.%N) agent pid $(cat "$DIR/agent.pid")" > "$DIR/timeline.txt"
  FREE0=$(free_mib)
  HALF=$((DURATION_S / 2))
  setsid nohup bash "$0" healthy "$DIR" "$DURATION_S" > "$DIR/healthy-supervisor.log" 2>&1 \
    < /dev/null &
  echo $! > "$DIR/server.pids"
  for _ in $(seq 240); do
    grep -q "transformers hooks" "$DIR/cb-healthy-1.log" 2>/dev/null && break
    sleep 0.5
  done
  sleep "${SETTLE_S:-15}"  # its KV pool and first batches allocated
  FREE1=$(free_mib)
  if [ -n "${KEEP_BYTES:-}" ]; then B=$KEEP_BYTES
  elif [ "$DEVICE" = cpu ]; then B=1048576
  elif [ -n "${GROW_FRACTION:-}" ]; then  # fill the grower's torch limit instead of the device
    TOTAL=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | head -n 1)
    B=$(python3 -c "print(int(($GROW_FRACTION * $TOTAL - ($FREE0 - $FREE1) - 512) * 1048576 / $FILL_S) // 2097152 * 2097152)")
    GROW_EXTRA="--memory-fraction $GROW_FRACTION"
  else  # fill what is left once the grower itself is loaded, less 512 MiB, in FILL_S
    B=$(( (FREE1 - (FREE0 - FREE1) - 512) * 1048576 / FILL_S / 2097152 * 2097152 ))
  fi
  printf '{"device": "%s", "duration_s": %s, "half_s": %s, "free_mib_before": %s, "free_mib_healthy_loaded": %s, "keep_bytes": %s, "grow_fraction": "%s", "keep_every_s": 1, "onset_s": %s, "fill_s": %s, "start_ts": %s}\n' \
    "$DEVICE" "$DURATION_S" "$HALF" "$FREE0" "$FREE1" "$B" "${GROW_FRACTION:-}" "$ONSET_S" "$FILL_S" "$(date +%s.%N)" \
    > "$DIR/meta.json"
  cat "$DIR/meta.json"
  # the grower: long enough that its OOM comes first (it stops at DURATION_S at the latest)
  setsid nohup bash -c "$(declare -f server); DIR='$DIR' DEVICE='$DEVICE'; \
    server cb-grow 0 '$DURATION_S' --keep-bytes '$B' --keep-every-s 1 --leak-start-s '$ONSET_S' ${GROW_EXTRA:-}" \
    > "$DIR/grow-supervisor.log" 2>&1 < /dev/null &
  echo $! >> "$DIR/server.pids"
  sleep 2
  echo "agent $(cat "$DIR/agent.pid"), healthy-1 $(cat "$DIR/cb-healthy-1.pid"), grow $(cat "$DIR/cb-grow.pid" 2>/dev/null)"
  ;;
healthy)  # internal: the healthy server, stopped at half time and started again (a new pid)
  DURATION_S=$3 T0=$(date +%s)
  server cb-healthy-1 1 $((DURATION_S / 2))
  server cb-healthy-2 2 $((DURATION_S - ($(date +%s) - T0)))
  ;;
snapshot)  # the lease may end before finish: what was recorded so far comes back anyway
  OUT=$3
  python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
    "$DIR/agent.db" "$DIR/snapshot.db"
  gzip -c "$DIR/snapshot.db" > "$OUT/growth_oom.snapshot.db.gz"
  tar -czf "$OUT/growth_oom_files.snapshot.tar.gz" -C "$DIR" --exclude='*.db' --exclude='*.db-*' --exclude=sock .
  cat "$DIR/timeline.txt"
  for n in cb-grow cb-healthy-1 cb-healthy-2; do
    [ -f "$DIR/$n.log" ] && { echo "== $n"; tail -n 3 "$DIR/$n.log"; }
  done
  tail -n 5 "$DIR/agent.log"
  ;;
finish)
  OUT=$3
  for pid in $(cat "$DIR/server.pids"); do
    while kill -0 "$pid" 2>/dev/null; do sleep 2; done
  done
  python3 -m vramscope status --config "$DIR/agent.toml" > "$OUT/status.txt" 2>&1 || true
  sidecar_finish "$DIR"
  cat "$DIR/timeline.txt"
  for n in cb-grow cb-healthy-1 cb-healthy-2; do
    echo "== $n"; tail -n 4 "$DIR/$n.log" || true
  done
  gzip -c "$DIR/agent.db" > "$OUT/growth_oom.db.gz"
  tar -czf "$OUT/growth_oom_files.tar.gz" -C "$DIR" --exclude='*.db' --exclude='*.db-*' --exclude=sock .
  timeout 240 python3 -m vramscope analyze --db "$DIR/agent.db" --json > "$OUT/analyze.json" \
    2> "$DIR/analyze.err" || { echo "analyze failed"; tail -n 5 "$DIR/analyze.err"; }
  ls -la "$OUT"
  ;;
*) echo "unknown mode $MODE"; exit 2 ;;
esac
