#!/usr/bin/env bash
# pp_save_check.sh LMSCALE CHECK_TABLE DECK GOLDEN OUTDIR
# Pipeline parallelism through the executable: the deck on 2 ranks as 2 stages (1F1B, 4
# microbatches) logs the golden losses (RTOL 2e-5: the microbatch split changes only summation
# order), and with 1 microbatch its train.save file (the stages' parameters gathered by name) is
# identical, dataset by dataset, to one process's.
set -euo pipefail
lmscale=$1 check=$2 deck=$3 golden=$4 outdir=$5
mkdir -p "$outdir"
mpi=(mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2)
"${mpi[@]}" "$lmscale" "$deck" --parallel.pp=2 --parallel.microbatches=4 --run.output="$outdir/pp2.h5"
"$check" "$outdir/pp2.h5" /train/steps loss "$golden" 2e-5
"$lmscale" "$deck" --run.output="$outdir/one.h5" --train.save="$outdir/one_weights.h5"
"${mpi[@]}" "$lmscale" "$deck" --parallel.pp=2 --parallel.microbatches=1 --run.output="$outdir/pp2m1.h5" \
  --train.save="$outdir/pp2_weights.h5"
n=$(h5ls "$outdir/pp2_weights.h5" | grep -c weight)
[ "$n" -eq "$(h5ls "$outdir/one_weights.h5" | grep -c weight)" ] || { echo "FAIL: $n parameters saved"; exit 1; }
for name in $(h5ls "$outdir/one_weights.h5" | awk '/weight/ {print $1}'); do
  h5diff -q "$outdir/one_weights.h5" "$outdir/pp2_weights.h5" "/$name" "/$name" || { echo "FAIL: $name differs"; exit 1; }
done
echo "pp=2: losses match the golden values; saved weights ($n parameters) equal one process's"
