#!/usr/bin/env bash
# opforge train against PyTorch (tests/bench/train_peer.py) on the same MLP, data, batch size,
# optimiser and thread count, run alternately; prints each run's samples/s and the median ratio.
# Needs Debian's python3-torch (1.13) for /usr/bin/python3, or PYTHON set to a venv's with PyTorch 2.x.
# Usage: tests/bench/train_vs_torch.sh [build dir] [runs] [threads]
set -euo pipefail
build=${1:-build}
runs=${2:-3}
threads=${3:-$(nproc)}
python=${PYTHON:-/usr/bin/python3}  # Debian's, with python3-torch; PYTHON=venv/bin/python for 2.x
here=$(dirname "$0")
ours=() theirs=()
for r in $(seq "$runs"); do
  o=$("$build/bin/opforge" train --epochs 1 --threads "$threads" --out "$(mktemp -d)" |
      sed -n 's/^epoch 1: .*(\([0-9]*\) samples\/s).*/\1/p')
  t=$("$python" "$here/train_peer.py" --threads "$threads" | sed -n 's/.* \([0-9]*\) samples\/s.*/\1/p')
  echo "run $r: opforge $o samples/s, torch $t samples/s"
  ours+=("$o") theirs+=("$t")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mo=$(median "${ours[@]}") mt=$(median "${theirs[@]}")
echo "median: opforge $mo samples/s, torch $mt samples/s, ratio $(awk "BEGIN {printf \"%.2f\", $mo / $mt}")x ($threads threads)"
