#!/usr/bin/env bash
# opforge train against PyTorch (tests/bench/train_peer.py) on the same model, data, batch size,
# optimiser and thread count, one whole epoch each, run alternately; prints each run's samples/s
# and the median ratio. PyTorch comes from .venv (scripts/bench-venv.sh: PyTorch 2.x) when there is
# one, else from /usr/bin/python3 (Debian's python3-torch 1.13); PYTHON overrides.
# Usage: tests/bench/train_vs_torch.sh [build dir] [runs] [threads] [model] [batch size]
set -euo pipefail
build=${1:-build}
runs=${2:-3}
threads=${3:-$(nproc)}
model=${4:-mlp}
batch=${5:-64}
here=$(dirname "$0")
default_python=/usr/bin/python3
[ -x "$here/../../.venv/bin/python" ] && default_python="$here/../../.venv/bin/python"
python=${PYTHON:-$default_python}
ours=() theirs=()
for r in $(seq "$runs"); do
  o=$("$build/bin/opforge" train --model "$model" --batch-size "$batch" --epochs 1 \
        --threads "$threads" --out "$(mktemp -d)" |
      sed -n 's/^epoch 1: .*(\([0-9]*\) samples\/s).*/\1/p')
  t=$("$python" "$here/train_peer.py" --model "$model" --batch-size "$batch" \
        --threads "$threads" | sed -n 's/.* \([0-9]*\) samples\/s.*/\1/p')
  echo "run $r: opforge $o samples/s, torch $t samples/s"
  ours+=("$o") theirs+=("$t")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mo=$(median "${ours[@]}") mt=$(median "${theirs[@]}")
echo "median: opforge $mo samples/s, torch $mt samples/s, ratio $(awk "BEGIN {printf \"%.2f\", $mo / $mt}")x ($model, batch $batch, $threads threads)"
