#!/usr/bin/env bash
# accounting_refusal.sh LMSCALE DECK OUTDIR
# The accounting job predicts the run a deck describes, and says so when lmscale would refuse to
# start that run: zero1 with a bf16 gradient reduction, and microbatches that do not divide the
# pipeline's batch, each get one "note: ... refuses to start (exit 2): <the run's own message>"
# line and exit 0; the same decks made valid (zero2; 2 microbatches) get none. A GPU deck
# accounted on this CPU (bf16 on 2 ranks) is not refused for its device.
set -uo pipefail
lmscale=$1 deck=$2 out=$3
mkdir -p "$out"; cd "$out" || exit 1
fail=0
check() {   # NAME WANT(note|none) ARGS...
  local name=$1 want=$2; shift 2
  "$lmscale" "$deck" --run.job=accounting --run.output="$name.h5" "$@" > "$name.log" 2>&1
  local rc=$?
  local notes; notes=$(grep -c "^note: these are predictions for a run lmscale refuses to start (exit 2): " "$name.log")
  if [[ $rc -ne 0 ]]; then echo "FAIL $name: exit $rc"; tail -3 "$name.log"; fail=1; return; fi
  if [[ $want == note && $notes -ne 1 ]] || [[ $want == none && $notes -ne 0 ]]; then
    echo "FAIL $name: $notes refusal notes, expected $want"; grep -E "^note" "$name.log"; fail=1; return
  fi
  echo "ok $name ($want) $(grep -E '^note' "$name.log" | cut -c1-160)"
}
check zero1_bf16 note --parallel.dp=2 --parallel.zero=zero1 --parallel.grad_reduce_dtype=bf16
grep -q "parallel.grad_reduce_dtype" zero1_bf16.log || { echo "FAIL: the note does not name the key"; fail=1; }
check zero2_bf16 none --parallel.dp=2 --parallel.zero=zero2 --parallel.grad_reduce_dtype=bf16
check pp_m4_of_6 note --parallel.pp=2 --train.batch_size=6 --parallel.microbatches=4
grep -q "parallel.microbatches" pp_m4_of_6.log || { echo "FAIL: the note does not name the key"; fail=1; }
check pp_m2_of_6 none --parallel.pp=2 --train.batch_size=6 --parallel.microbatches=2
check gpu_deck none --parallel.dp=2 --precision.mode=bf16 --parallel.device=cpu --parallel.backend=mpi
[[ $fail -eq 0 ]] && echo PASS
exit $fail
