#!/usr/bin/env bash
# Makes the virtual environment of the heavy benchmark peers (never used by `make test`): PyTorch
# 2.x from the Python package registry (its default wheel, with several GB of CUDA libraries: the
# registry is the one package index these machines reach), safetensors and NumPy, in .venv at the
# repository root (or $VENV). Idempotent.
# `opforge bench --train` and tests/bench/train_vs_torch.sh use .venv/bin/python when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
python=${PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "torch>=2"
"$venv/bin/python" -m pip install -q safetensors numpy
"$venv/bin/python" -c 'import torch, safetensors, numpy; print("bench venv:", "torch", torch.__version__, "safetensors", safetensors.__version__, "numpy", numpy.__version__)'
