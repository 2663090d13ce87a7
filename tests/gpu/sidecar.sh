# The agent as a sidecar, for the scripts that record inference servers THROUGH A RUNNING AGENT
# (record_agent_pair.sh, record_cb_pair.sh, record_growth_oom.sh). Sourced, not run: sourcing
# it enters the repository root and puts the carried wheels on the path (sidecar_env); then
#   sidecar_env                 # the carried wheels (.whl: ../shared/tools/gpu-wheels.sh orjson) on
#                               # the path, installed once where the machine lacks them
#   sidecar_start DIR [TOML]    # `vramscope agent` on DIR/sock/agent.sock and DIR/agent.db,
#                               # TOML appended to its config; returns once its socket is up
#   sidecar_finish DIR          # wait for the servers in DIR/server.pids, then stop the agent

sidecar_env() {
  export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
  if ! python3 -c "import sqlalchemy, alembic, flask, plotly, waitress, orjson" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl
  fi
}

sidecar_start() {
  local dir=$1 extra=${2:-}
  mkdir -p "$dir/sock" && chmod 700 "$dir/sock"
  cat > "$dir/agent.toml" <<TOML
[agent]
socket_path = "$dir/sock/agent.sock"

[database]
url = "sqlite:///$dir/agent.db"
$extra
TOML
  setsid nohup python3 -m vramscope agent --config "$dir/agent.toml" \
    > "$dir/agent.log" 2>&1 < /dev/null &
  echo $! > "$dir/agent.pid"
  for _ in $(seq 60); do [ -S "$dir/sock/agent.sock" ] && return 0; sleep 0.5; done
  echo "agent did not start"
  cat "$dir/agent.log"
  exit 1
}

sidecar_finish() {
  local dir=$1 pid
  for pid in $(cat "$dir/server.pids"); do
    while kill -0 "$pid" 2>/dev/null; do sleep 2; done
  done
  sleep 3  # the servers' last messages reach the agent's store
  kill -TERM "$(cat "$dir/agent.pid")" || true
  while kill -0 "$(cat "$dir/agent.pid")" 2>/dev/null; do sleep 1; done
}

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
sidecar_env
