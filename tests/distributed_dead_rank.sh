#!/bin/sh
# A rank that dies (rank 1 killed 3 s into a two-rank opforge train --distributed) ends the job
# within a bound, with a message naming the rank: the other rank never hangs in its all-reduce.
#   tests/distributed_dead_rank.sh MPIEXEC OPFORGE RUN_FOLDER
mpiexec=$1 opforge=$2 dir=$3
rm -rf "$dir"
start=$(date +%s)
out=$(timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe -np 2 sh -c \
  'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then (sleep 3; kill -9 $$) & fi; exec "$0" "$@"' \
  "$opforge" train --distributed --epochs 5 --batch-size 100 --seed 1 --out "$dir" 2>&1)
rc=$?
took=$(( $(date +%s) - start ))
echo "$out" | grep -v '^epoch' | tail -6
echo "exit status $rc after $took s"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -lt 60 ] && echo "$out" | grep -q 'rank 1'
