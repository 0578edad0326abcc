#!/usr/bin/env bash
# trace.sh LMSCALE DECK OUTDIR
# run.trace on CPU (docs/profiling.md): a 2-rank train with ddp = bucketed and a 2-rank bench-model
# write one Chrome trace per rank (NAME.rank{r}.json; NAME.rank{r}.json.gz when run.trace ends in
# .json.gz), checked by trace_check.py: the keys HTA's trace parser requires (distributedInfo with
# the rank, cat and dur on every slice, a ProfilerStep#N per step), structure, both ranks, ranges
# nested in their steps, collectives with bytes on the comm track, sampled memory counters, no
# empty track; a bad trace target is refused with exit 2 naming run.trace; an earlier trace is
# replaced.
set -uo pipefail
lmscale=$1 deck=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
mpirun="mpirun --oversubscribe --allow-run-as-root -np 2"
mkdir -p "$out"; cd "$out" || exit 1
rm -rf train.* bench.* gz.* notrace* adir
fail() { echo "FAIL: $*"; exit 1; }

$mpirun "$lmscale" "$deck" --run.output=train.h5 --run.trace=train.json --parallel.ddp=bucketed \
  --parallel.bucket_mb=0.01 || fail "train with run.trace exited $?"
ls train.rank*.json* || true
for f in train.json train.rank0.json.tmp train.rank1.json.tmp; do [[ ! -e $f ]] || fail "$f left behind"; done
python3 "$here/trace_check.py" train.json 2 12 train_step forward backward gradient_sync optimizer layer \
  attention_block scores softmax weighted_sum --collectives --self-test || exit 1
for r in 0 1; do
  grep -q '"cuda compute"\|"comm p2p"' "train.rank$r.json" && fail "train.rank$r.json declares a track without events"
done

$mpirun "$lmscale" "$deck" --run.job=bench-model --run.output=bench.h5 --run.trace=bench.json.gz \
  --bench.mode=train-step --bench.warmup=1 --bench.steps=2 --parallel.ddp=bucketed --parallel.bucket_mb=0.01 \
  || fail "bench-model with run.trace exited $?"
for r in 0 1; do
  [[ $(head -c 2 "bench.rank$r.json.gz" | od -An -tx1 | tr -d ' ') == 1f8b ]] || fail "bench.rank$r.json.gz is not gzip"
done
python3 "$here/trace_check.py" bench.json.gz 2 3 "timed_step|warmup_step" train_step forward backward optimizer \
  --collectives || exit 1

# An earlier trace is replaced (the overwrite rule for traces), gzip or not.
"$lmscale" "$deck" --run.output=train.h5 --run.trace=train.json --train.steps=2 --optim.warmup_steps=1 || fail "rerun onto a trace exited $?"
python3 "$here/trace_check.py" train.json 1 2 train_step forward backward optimizer || exit 1
"$lmscale" "$deck" --run.job=bench-model --run.output=bench.h5 --run.trace=bench.json.gz --bench.warmup=0 \
  --bench.steps=1 || fail "rerun onto a gzip trace exited $?"
python3 "$here/trace_check.py" bench.json.gz 1 1 timed_step || exit 1

# Bad targets: a rank's file that is not a trace, a directory. Exit 2, the message names run.trace.
echo "keep me" > notrace.rank0.json; mkdir -p adir
for target in notrace.json adir/; do
  rc=0; "$lmscale" "$deck" --run.output=bad.h5 --run.trace="$target" > bad.log 2>&1 || rc=$?
  cat bad.log
  [[ $rc -eq 2 ]] || fail "run.trace = $target: exit $rc, expected 2"
  grep -q "run.trace" bad.log || fail "run.trace = $target: the message does not name run.trace"
done
[[ "$(cat notrace.rank0.json)" == "keep me" ]] || fail "notrace.rank0.json was changed"
echo PASS
