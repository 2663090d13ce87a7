#!/usr/bin/env bash
# Install what the tests need on a fresh Debian/Ubuntu machine, then run them.
# This is the README's test command, and .ci/run calls it unchanged.
#
#   tests/run.sh                 # the CI set: everything but `gpu` and `slow`
#   tests/run.sh -m slow         # extra pytest arguments are passed through
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

# System packages: Chromium + driver (browser tests), PostgreSQL server (postgres tests),
# promtool (Prometheus rule tests). Installed only when missing.
pkgs=()
command -v chromium >/dev/null || pkgs+=(chromium)
command -v chromedriver >/dev/null || pkgs+=(chromium-driver)
command -v promtool >/dev/null || pkgs+=(prometheus)
command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || pkgs+=(postgresql)
if [ ${#pkgs[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
fi

# Python packages. torch is pinned: 2.13.0's CPU build is what CI has on local disk.
python3 -m pip install -q --disable-pip-version-check 'torch==2.13.0' -e '.[test]'

# One real PostgreSQL server for the `postgres` tests, on a free loopback port, stopped on exit.
read -r PG_URL PG_ROOT PG_CTL PG_DATA < <(python3 -m tests.support.pgserver)
stop_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$PG_CTL" -D "$PG_DATA" -m fast stop >/dev/null || true
  else "$PG_CTL" -D "$PG_DATA" -m fast stop >/dev/null || true; fi
  rm -rf "$PG_ROOT"
}
trap stop_pg EXIT
export VRAMSCOPE_TEST_POSTGRES_URL="$PG_URL"

ruff check .
python3 -m pytest -m "not gpu and not slow" "$@"
