#!/usr/bin/env bash
# trace.sh LMSCALE DECK OUTDIR
# run.trace on CPU (docs/profiling.md): a 2-rank train with ddp = bucketed and a 2-rank bench-model
# write one merged Chrome trace each, checked by trace_check.py (structure, both ranks, ranges nested
# in their steps, collectives with bytes on the comm track, memory counters); a bad trace target is
# refused with exit 2 naming run.trace; an earlier trace is replaced.
set -uo pipefail
lmscale=$1 deck=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
mpirun="mpirun --oversubscribe --allow-run-as-root -np 2"
mkdir -p "$out"; cd "$out" || exit 1
rm -rf train.json train.json.tmp bench.json bench.json.tmp train.h5 bench.h5 notrace.txt adir
fail() { echo "FAIL: $*"; exit 1; }

$mpirun "$lmscale" "$deck" --run.output=train.h5 --run.trace=train.json --parallel.ddp=bucketed \
  --parallel.bucket_mb=0.01 || fail "train with run.trace exited $?"
[[ ! -e train.json.tmp ]] || fail "train.json.tmp left behind"
python3 "$here/trace_check.py" train.json 2 train_step forward backward gradient_sync optimizer layer \
  attention_block scores softmax weighted_sum --collectives --self-test || exit 1

$mpirun "$lmscale" "$deck" --run.job=bench-model --run.output=bench.h5 --run.trace=bench.json \
  --bench.mode=train-step --bench.warmup=1 --bench.steps=2 --parallel.ddp=bucketed --parallel.bucket_mb=0.01 \
  || fail "bench-model with run.trace exited $?"
python3 "$here/trace_check.py" bench.json 2 "timed_step|warmup_step" train_step forward backward optimizer \
  --collectives || exit 1

# An earlier trace is replaced (the overwrite rule for traces).
"$lmscale" "$deck" --run.output=train.h5 --run.trace=train.json --train.steps=2 --optim.warmup_steps=1 || fail "rerun onto a trace exited $?"
python3 "$here/trace_check.py" train.json 1 train_step forward backward optimizer || exit 1

# Bad targets: a file that is not a trace, a directory. Exit 2, the message names run.trace.
echo "keep me" > notrace.txt; mkdir -p adir
for target in notrace.txt adir/; do
  rc=0; "$lmscale" "$deck" --run.output=bad.h5 --run.trace="$target" > bad.log 2>&1 || rc=$?
  cat bad.log
  [[ $rc -eq 2 ]] || fail "run.trace = $target: exit $rc, expected 2"
  grep -q "run.trace" bad.log || fail "run.trace = $target: the message does not name run.trace"
done
[[ "$(cat notrace.txt)" == "keep me" ]] || fail "notrace.txt was changed"
echo PASS
