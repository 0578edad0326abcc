#!/usr/bin/env bash
# CTest `slurm.elastic_plan`: the decisions of slurm/train_elastic.sbatch without a cluster.
#
#   run_elastic_plan_test.sh LMSCALE_BIN
#
# Sources slurm/common.sh and slurm/elastic.sh and checks
#   - lmscale_elastic_plan: the layout on fewer nodes keeps tp, pp, the global batch and the
#     micro-batch (dp and the accumulation count), and refuses with exit 2 and the reason when no
#     replica fits, the ranks are not a multiple of tp x pp, or the batch does not split;
#   - lmscale_elastic_shape: the deck's layout read from lmscale --print-config (grad_accum, or
#     parallel.microbatches with pp), and exit 2 for a deck that does not fit the ranks;
#   - lmscale_set: an override replaced, not given twice;
#   - lmscale_elastic_remaining against a scripted Slurm (scontrol and sinfo as shell functions):
#     a node taken out of the job, a node down or not responding, and no loss within the wait.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
[[ $# -eq 1 ]] || { echo "usage: run_elastic_plan_test.sh LMSCALE_BIN" >&2; exit 1; }
export LMSCALE_BIN=$1 LMSCALE_ROOT=$repo
source "$repo/slurm/common.sh"
source "$repo/slurm/elastic.sh"

fail=0
check() {  # DESCRIPTION EXPECTED ACTUAL
  if [[ $2 == "$3" ]]; then echo "ok: $1"; else echo "FAIL: $1: expected '$2', got '$3'"; fail=1; fi
}
plan() {  # args of lmscale_elastic_plan -> "OUT|RC|ERR"
  local out err rc
  err=$(mktemp)
  out=$(lmscale_elastic_plan "$@" 2>"$err"); rc=$?
  echo "$out|$rc|$(cat "$err")"; rm -f "$err"
}

# ---- lmscale_elastic_plan NODES TPN TP PP BATCH MICRO -> WORLD DP ACCUM ----
check "2 -> 1 node, 1 task each, batch 8 of micro 4: dp 1, grad_accum 2" "1 1 2|0|" "$(plan 1 1 1 1 8 4)"
check "4 -> 3 nodes x 2 tasks, tp 2, batch 24 of micro 2: 6 ranks, dp 3, accum 4" "6 3 4|0|" "$(plan 3 2 2 1 24 2)"
check "8 -> 7 nodes x 8 tasks, tp 4 x pp 2, batch 56 of micro 1: dp 7, accum 8" "56 7 8|0|" "$(plan 7 8 4 2 56 1)"
r=$(plan 1 2 4 1 8 1)
check "2 ranks cannot hold tp 4: exit 2" 2 "$(cut -d'|' -f2 <<<"$r")"
[[ $r == *"cannot hold one model replica of parallel.tp x parallel.pp = 4 x 1 = 4 ranks; resubmit on at least 2 node(s)"* ]] \
  && echo "ok: the message names the replica and the nodes needed" || { echo "FAIL: message: $r"; fail=1; }
r=$(plan 3 1 2 1 12 1)
check "3 ranks with tp 2: exit 2" 2 "$(cut -d'|' -f2 <<<"$r")"
[[ $r == *"3 rank(s) is not a multiple of parallel.tp x parallel.pp = 2"* ]] && echo "ok: names the multiple" \
  || { echo "FAIL: message: $r"; fail=1; }
r=$(plan 3 1 1 1 8 4)
check "batch 8 of micro 4 on 3 ranks: exit 2" 2 "$(cut -d'|' -f2 <<<"$r")"
[[ $r == *"train.batch_size = 8 does not split into 3 data-parallel rank(s) x micro-batches of 4 sequence(s)"* ]] \
  && echo "ok: names train.batch_size, dp and the micro-batch" || { echo "FAIL: message: $r"; fail=1; }

# ---- lmscale_elastic_shape: the deck's layout from lmscale --print-config ----
LMSCALE_DECK=$here/decks/tiny_train.ini LMSCALE_OVERRIDES=(--train.batch_size=8 --train.grad_accum=2)
lmscale_elastic_shape 2
check "tiny deck on 2 ranks, batch 8, grad_accum 2" "1 1 2 8 train.grad_accum 2 2" \
  "$ELASTIC_TP $ELASTIC_PP $ELASTIC_DP $ELASTIC_BATCH $ELASTIC_ACCUM_KEY $ELASTIC_ACCUM $ELASTIC_MICRO"
LMSCALE_OVERRIDES=(--model.num_layers=2 --parallel.pp=2 --parallel.microbatches=4 --train.batch_size=8)
lmscale_elastic_shape 4
check "pp 2 on 4 ranks: dp 2, parallel.microbatches 4, micro 1" "1 2 2 8 parallel.microbatches 4 1" \
  "$ELASTIC_TP $ELASTIC_PP $ELASTIC_DP $ELASTIC_BATCH $ELASTIC_ACCUM_KEY $ELASTIC_ACCUM $ELASTIC_MICRO"
lmscale_elastic_shape 3 2>/dev/null
check "pp 2 on 3 ranks: exit 2" 2 "$?"

# ---- lmscale_set ----
LMSCALE_OVERRIDES=(--a.b=1 --parallel.dp=2 --c.d=3)
lmscale_set parallel.dp 1
lmscale_set train.grad_accum 4
check "lmscale_set replaces and adds" "--a.b=1 --c.d=3 --parallel.dp=1 --train.grad_accum=4" "${LMSCALE_OVERRIDES[*]}"

# ---- lmscale_elastic_remaining against a scripted Slurm ----
job_nodes="n[0-1]" state_n1=mix
scontrol() {
  case "$*" in
    "--oneliner show job 7") echo "JobId=7 JobName=x NodeList=$job_nodes BatchHost=n0" ;;
    "show hostnames n[0-1]") printf 'n0\nn1\n' ;;
    "show hostnames n0") echo n0 ;;
    *) return 1 ;;
  esac
}
sinfo() {  # sinfo -h -N -n NODE -o %t
  if [[ $4 == n1 ]]; then echo "$state_n1"; else echo mix; fi
}
t0=$SECONDS
lmscale_elastic_remaining 7 2 n0 n1 >/dev/null
check "no node lost within 2 s: returns 1" 1 "$?"
(( SECONDS - t0 <= 5 )) && echo "ok: the wait is bounded" || { echo "FAIL: waited $((SECONDS - t0)) s"; fail=1; }
job_nodes=n0
check "n1 taken out of the job: n0 remains" "n0" "$(lmscale_elastic_remaining 7 2 n0 n1 | tr '\n' ' ' | sed 's/ $//')"
job_nodes="n[0-1]" state_n1='idle*'
check "n1 not responding: n0 remains" "n0" "$(lmscale_elastic_remaining 7 2 n0 n1 | tr '\n' ' ' | sed 's/ $//')"
state_n1=down
check "n1 down: n0 remains" "n0" "$(lmscale_elastic_remaining 7 2 n0 n1 | tr '\n' ' ' | sed 's/ $//')"

[[ $fail -eq 0 ]] && echo "PASS" || echo "FAILED"
exit "$fail"
