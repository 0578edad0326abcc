#!/usr/bin/env bash
# Rank failure on 2 GPUs of one node over NCCL (docs/checkpoints.md "Rank failure"), with Open
# MPI's mpirun (it finds rank 1's process by OMPI_COMM_WORLD_RANK); about 90 s after the build:
#   scripts/gpu/rank_failure.sh [stages...]      default: build nccl healthy kill hang
#   build    scripts/gpu/build.sh for lmscale, check_table, mpi_test_nccl_comm
#   nccl     the 2-rank NCCL communicator test (non-blocking communicators: collectives, groups,
#            split, health, abort)
#   healthy  2 ranks, DDP bucketed, 150 steps, parallel.timeout_s = 0 and = 10: both exit 0 with
#            identical losses (the watchdog changes nothing), mean step times side by side
#   kill     rank 1 is made to sleep at step 30 (test-only LMSCALE_FAULT_SLEEP_*), so rank 0 is
#            inside the bucketed all-reduce of step 30; then kill -9 of rank 1: the job must end
#            non-zero within 60 s, the output naming rank 1, and the rows flushed before (>= 20)
#            readable in K.h5.tmp
#   hang     rank 1 sleeps at step 30 (not killed), parallel.timeout_s = 10: the job must end
#            non-zero within 60 s with ONE lmscale error line naming rank 1 as the rank that hangs,
#            and the flushed rows readable in H.h5.tmp
#   bench    the hang case in bench-model (train-step mode): ends within 60 s naming rank 1
#   usage    rank 1 alone fails mid-job with a usage error (a bad test-only variable it reads when
#            it builds its trainer, after every agreed check) while rank 0 enters the first step's
#            NCCL collectives: the job must end with exit 2 within 15 s, with one lmscale error
#            line naming rank 1 and the variable
# Prints one PASS/FAIL line per check and a final "rank_failure: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build nccl healthy kill hang}
OUT=${OUT:-/tmp/rank_failure_out}
source scripts/gpu/env.sh
mkdir -p "$OUT"
LM=$BUILD/lmscale
T0=$(date +%s)
summary=$OUT/summary.txt
: > "$summary"
has() { [[ " $stages " == *" $1 "* ]]; }
note() { echo "$*" | tee -a "$summary"; }
passed=0 failed=0
check() {   # check NAME CONDITION-EXIT-CODE DETAIL
  if [[ $2 -eq 0 ]]; then note "PASS $1: $3"; passed=$((passed + 1)); else note "FAIL $1: $3"; failed=$((failed + 1)); fi
}
# A tiny GPU model with many small buckets, a row flushed per step (log_every = 1).
ARGS=(ctest/regression/tiny_train.ini --parallel.device=cuda --parallel.ddp=bucketed --parallel.bucket_mb=0.25
      --model.d_model=256 --model.d_ff=704 --model.num_layers=4 --model.num_heads=4 --model.context_length=128
      --model.vocab_size=1000 --train.batch_size=16 --train.log_every=1 --run.progress=true)
rows() { "$BUILD/ctest/regression/check_table" "$1" /train/steps loss - 0 2>/dev/null | grep -cE '^[-0-9.e+]+$'; }
# Starts mpirun in the background (pid in $job) and waits until rank 1 has begun its injected sleep.
start_and_wait_sleep() {
  local log=$1; shift
  LMSCALE_FAULT_SLEEP_RANK=1 LMSCALE_FAULT_SLEEP_STEP=30 LMSCALE_FAULT_SLEEP_S=600 \
    "${MPIRUN[@]}" -x LMSCALE_FAULT_SLEEP_RANK -x LMSCALE_FAULT_SLEEP_STEP -x LMSCALE_FAULT_SLEEP_S -np 2 \
    "$LM" "${ARGS[@]}" "$@" > "$log" 2>&1 &
  job=$!
  for _ in $(seq 1 1200); do
    grep -q "test-only fault injection" "$log" && return 0
    kill -0 "$job" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
rank_pid() {   # the pid of world rank $1 among mpirun's children
  local p
  for p in $(pgrep -P "$job"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}

nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$summary"
if has build; then
  scripts/gpu/build.sh lmscale check_table mpi_test_nccl_comm > "$OUT/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$OUT/build.log" | head -30; note "FAIL build"; exit 1; }
  note "build done at $(( $(date +%s) - T0 )) s"
fi
if has nccl; then
  timeout 120 "${MPIRUN[@]}" -np 2 "$BUILD/ctest/mpi/mpi_test_nccl_comm" > "$OUT/test_nccl_comm.log" 2>&1
  rc=$?
  check nccl $rc "mpi_test_nccl_comm on 2 GPUs rc=$rc $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/test_nccl_comm.log" | tr '\n' ' ')"
fi
if has healthy; then
  for t in 0 10; do
    timeout 120 "${MPIRUN[@]}" -np 2 "$LM" "${ARGS[@]}" --train.steps=150 --parallel.timeout_s=$t \
      --run.output="$OUT/healthy_t$t.h5" > "$OUT/healthy_t$t.log" 2>&1
    eval "rc_$t=$?"
  done
  "$BUILD/ctest/regression/check_table" "$OUT/healthy_t0.h5" /train/steps loss - 0 > "$OUT/healthy_t0.losses" 2>&1
  "$BUILD/ctest/regression/check_table" "$OUT/healthy_t10.h5" /train/steps loss "$OUT/healthy_t0.losses" 0 \
    > "$OUT/healthy_cmp.log" 2>&1
  same=$?
  ms() { "$BUILD/ctest/regression/check_table" "$1" /train/steps step_ms - 0 2>/dev/null | tail -n 100 |
         awk '/^[-0-9.e+]+$/ {s += $1; n++} END {if (n) printf "%.3f", s / n}'; }
  check healthy $(( rc_0 != 0 || rc_10 != 0 || same != 0 )) \
    "timeout_s 0: rc=$rc_0, timeout_s 10: rc=$rc_10, losses identical: $([[ $same -eq 0 ]] && echo yes || echo NO); mean step (last 100) $(ms "$OUT/healthy_t0.h5") ms without the watchdog, $(ms "$OUT/healthy_t10.h5") ms with it"
fi
if has kill; then
  if start_and_wait_sleep "$OUT/K.log" --train.steps=100000 --parallel.timeout_s=30 --run.output="$OUT/K.h5"; then
    sleep 1   # rank 0 is now waiting in step 30's bucketed all-reduce
    victim=$(rank_pid 1)
    t0=$SECONDS
    kill -KILL "$victim"
    wait "$job"; rc=$?
    dt=$((SECONDS - t0))
    n=$(rows "$OUT/K.h5.tmp")
    named=$(grep -aE "rank 1 did not answer|process rank 1 |rank 1 hangs|rank 1: " "$OUT/K.log" | grep -v "fault injection" | head -2 | tr '\n' ' ')
    check kill-exit $(( rc == 0 || dt > 60 )) "kill -9 of rank 1 inside step 30: exit $rc after ${dt} s"
    check kill-names-rank $([[ -n $named ]]; echo $?) "message: ${named:-none naming rank 1}"
    check kill-rows $(( n < 20 )) "$n rows readable in K.h5.tmp"
  else
    check kill 1 "the run never reached the injected sleep: $(tail -n 5 "$OUT/K.log" | tr '\n' ' ')"
  fi
fi
hang_case() {   # NAME LOG H5 extra args...
  local name=$1 log=$2 h5=$3; shift 3
  if start_and_wait_sleep "$log" "$@" --parallel.timeout_s=10 --run.output="$h5"; then
    t0=$SECONDS
    wait "$job"; rc=$?
    dt=$((SECONDS - t0))
    lines=$(grep -acE "^lmscale: rank [0-9]+: error:" "$log")
    line=$(grep -aE "^lmscale: rank [0-9]+: error:" "$log" | head -1)
    check $name-exit $(( rc == 0 || dt > 60 )) "rank 1 asleep from step 30, parallel.timeout_s = 10: exit $rc ${dt} s after the sleep began"
    check $name-one-message $(( lines != 1 )) "$lines lmscale error line(s)"
    check $name-names-rank $([[ $line == *"rank 1 hangs outside communication"* || $line == *"rank 1 did not answer"* ]]; echo $?) "${line:-no line}"
  else
    check $name 1 "the run never reached the injected sleep: $(tail -n 5 "$log" | tr '\n' ' ')"
  fi
}
if has hang; then
  hang_case hang "$OUT/H.log" "$OUT/H.h5" --train.steps=100000
  n=$(rows "$OUT/H.h5.tmp")
  check hang-rows $(( n < 20 )) "$n rows readable in H.h5.tmp"
fi
if has bench; then
  hang_case bench "$OUT/B.log" "$OUT/B.h5" --run.job=bench-model --bench.mode=train-step --bench.warmup=2 \
    --bench.steps=100000 --bench.batch_size=16
fi
if has usage; then
  t0=$SECONDS
  timeout -k 5 120 "${MPIRUN[@]}" -np 1 "$LM" "${ARGS[@]}" --train.steps=100000 --parallel.timeout_s=0 \
    --run.output="$OUT/U.h5" : -np 1 -x LMSCALE_FAULT_SLEEP_RANK=one "$LM" "${ARGS[@]}" --train.steps=100000 \
    --parallel.timeout_s=0 --run.output="$OUT/U.h5" > "$OUT/U.log" 2>&1
  rc=$?
  dt=$((SECONDS - t0))
  lines=$(grep -acE "lmscale: (rank [0-9]+: )?error:" "$OUT/U.log")
  line=$(grep -aE "lmscale: (rank [0-9]+: )?error:" "$OUT/U.log" | head -1)
  check usage-exit $(( rc != 2 || dt > 15 )) "rank 1's usage error mid-job over NCCL: exit $rc after ${dt} s (expected 2 within 15 s)"
  check usage-one-message $(( lines != 1 )) "$lines lmscale error line(s)"
  check usage-names-rank $([[ $line == *"rank 1"* && $line == *LMSCALE_FAULT_SLEEP_RANK* ]]; echo $?) "${line:-no line}"
fi
note "rank_failure: $passed passed, $failed failed ($(( $(date +%s) - T0 )) s)"
[[ $failed -eq 0 ]]
