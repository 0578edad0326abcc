#!/usr/bin/env bash
# Reliability cases of issue 36 through the real executable (docs/reliability.md has the table).
# Each case makes its own files in a fresh temporary folder, runs lmscale on a tiny CPU train deck
# (every run bounded by `timeout`), and checks the exit code, the message and what is on disk.
# Usage: reliability.sh LMSCALE CASE
set -u
lmscale=$1
case_name=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/ctest/regression/reliability_common.sh"

case "$case_name" in
  # ---- A: outputs identified by file identity -------------------------------------------------
  alias_save_output)   # the results file and the weights file, spelt differently
    run --train.save=./out.h5
    expect_usage_error run.output train.save ;;
  alias_checkpoint_absolute)   # an absolute spelling of run.output as the single-file checkpoint
    run --train.checkpoint_every=1 --train.checkpoint_path="$tmp/out.h5"
    expect_usage_error run.output train.checkpoint_path ;;
  alias_save_checkpoint_path)   # weights file = checkpoint file: the resume would restart at 0
    run --train.save=w.h5 --train.checkpoint_every=1 --train.checkpoint_path=sub/../w.h5
    expect_usage_error train.save train.checkpoint_path
    check "w.h5 was not created" test ! -e w.h5 ;;
  alias_trace_output)
    run --run.trace=./out.h5
    expect_usage_error run.trace run.output ;;
  alias_save_in_checkpoint_dir)   # train.save would replace the final checkpoint's index
    run --train.checkpoint_dir=ck --train.checkpoint_every=1 --train.save=ck/step_00000002/index.h5
    expect_usage_error train.save train.checkpoint_dir
    check "no checkpoint was written" test ! -e ck/step_00000001 ;;
  alias_prune_inplace)   # prune.output = the weights it reads
    run --train.save=w.h5 --train.steps=3
    check "the weights run exited $rc" test "$rc" -eq 0
    sum=$(md5sum <w.h5)
    rm -f out.h5
    run --run.job=prune --prune.weights=w.h5 --prune.output=./w.h5 --prune.target_sparsity=0.5 \
      --prune.finetune_steps=1
    expect_usage_error prune.weights prune.output
    check "w.h5 is unchanged" test "$(md5sum <w.h5)" = "$sum" ;;
  alias_companion_names)   # an output named like another output's temporary file or lock
    run --train.save=out.h5.tmp
    expect_usage_error train.save run.output out.h5.tmp
    run --train.save=./out.h5.lock
    expect_usage_error train.save run.output out.h5.lock
    run --train.checkpoint_dir=ck --train.save=ck/lmscale.lock
    expect_usage_error train.save train.checkpoint_dir lmscale.lock
    check "no weights file was written" test ! -e out.h5.tmp -a ! -e out.h5.lock -a ! -e ck/lmscale.lock ;;
  concurrent_output)   # a second run writing the same run.output while the first runs
    "$lmscale" deck.ini --run.output=out.h5 --train.steps=1000000 >first.out 2>first.err &
    bg=$!
    for _ in $(seq 300); do
      grep -q '^step' first.out && break
      sleep 0.1
    done
    check "the first run is writing out.h5.tmp" test -s out.h5.tmp
    run --train.steps=2
    check "exit code $rc, expected 2" test "$rc" -eq 2
    check "an 'lmscale: error:' line names run.output and the first run's pid $bg" error_names run.output "pid=$bg"
    check "out.h5 was not created" test ! -e out.h5
    check "the first run is still running" kill -0 "$bg"
    check "the first run's out.h5.tmp is still there" test -s out.h5.tmp
    kill -TERM "$bg"; wait "$bg"; bg_rc=$?; bg=""
    check "the first run ended with exit $bg_rc, expected 75 (interrupted)" test "$bg_rc" -eq 75
    check "the first run finished its out.h5" is_hdf5 out.h5
    check "the lock file is gone" test ! -e out.h5.lock ;;
  lock_symlink)   # a symbolic link planted at NAME.lock is refused, never followed
    echo "precious" >victim; ln -s victim out.h5.lock
    run
    expect_usage_error run.output "symbolic link"
    check "victim is unchanged" test "$(cat victim)" = precious ;;
  tmp_symlink)   # a symbolic link planted at NAME.tmp is replaced, never written through
    : >victim; ln -s victim out.h5.tmp
    run
    check "exit code $rc, expected 0" test "$rc" -eq 0
    check "victim is still empty" test ! -s victim
    check "out.h5 is an HDF5 file" is_hdf5 out.h5
    check "out.h5.tmp is gone" test ! -e out.h5.tmp ;;
  kill9_partial_readable)   # kill -9 with progress = false and a large log_every: NAME.tmp readable
    "$lmscale" deck.ini --run.output=out.h5 --train.steps=1000000 --run.progress=false \
      --train.log_every=1000000 >first.out 2>first.err &
    bg=$!
    for _ in $(seq 300); do
      [ -s out.h5.tmp ] && break
      sleep 0.1
    done
    sleep 2
    kill -KILL "$bg"; wait "$bg" 2>/dev/null; bg=""
    rows=$(python3 -c "import h5py; print(len(h5py.File('out.h5.tmp')['/train/steps']))" 2>&1 | tail -1)
    check "out.h5.tmp opens with h5py and holds rows (got: $rows)" test "${rows:-0}" -ge 1 2>/dev/null
    # the lock the killed run left behind is taken over by the next run
    run
    check "the next run (lock left by kill -9) exited $rc, expected 0" test "$rc" -eq 0
    check "the next run wrote out.h5" is_hdf5 out.h5 ;;
  kill9_flush_time_bound)   # the step table reaches the disk on the time bound alone
    # (test-only: LMSCALE_TEST_FLUSH_S = 0.3 s instead of 10 s; no log step after the first, so
    # without the time bound the killed run's table holds the first step's row only)
    LMSCALE_TEST_FLUSH_S=0.3 "$lmscale" deck.ini --run.output=out.h5 --train.steps=1000000 --run.progress=false \
      --train.log_every=1000000 >first.out 2>first.err &
    bg=$!
    for _ in $(seq 300); do
      [ -s out.h5.tmp ] && break
      sleep 0.1
    done
    sleep 3
    kill -KILL "$bg"; wait "$bg" 2>/dev/null; bg=""
    rows=$(python3 -c "import h5py; print(len(h5py.File('out.h5.tmp')['/train/steps']))" 2>&1 | tail -1)
    check "out.h5.tmp opens with h5py and holds more than the first step's row (got: $rows)" \
      test "${rows:-0}" -ge 10 2>/dev/null ;;
  # ---- B: crash and parse paths -----------------------------------------------------------------
  full_disk_results)   # the results file's disk fills mid-run: exit 1 naming the errno, no SIGSEGV at exit
    (trap '' XFSZ; exec "$lmscale" deck.ini --run.output=out.h5 --train.steps=1000000 --train.log_every=1 \
      --run.progress=false >stdout 2>stderr) &
    bg=$!
    wait_for_rows
    fill_disk "$bg"
    wait_for_exit "$bg" 60; bg=""
    check "exit code $rc, expected 1 (139 = SIGSEGV, 124 = hung)" test "$rc" -eq 1
    check "an 'lmscale: rank 0: error:' line names the file and the errno" \
      bash -c "grep 'lmscale: rank 0: error:' stderr | grep -F \"out.h5.tmp\" | grep -qF 'errno 27, EFBIG'"
    check "no HDF5 error stack is printed" bash -c '! grep -q HDF5-DIAG stderr'
    check "the kept out.h5.tmp is named" grep -qF "are kept in 'out.h5.tmp'" stderr ;;
  full_disk_results_2ranks)   # the same on rank 0 of 2 (log_every = 1): the job ends, no rank hangs
    # d_model 64: the gradients (> 64 KiB) go through the shared-memory all-reduce, whose window
    # free (MPI_Win_free) is collective
    # (mpirun resets the ranks' signals: each rank ignores SIGXFSZ in the shell that becomes it)
    timeout -k 5 90 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
      bash -c 'trap "" XFSZ; exec "$0" "$@"' "$lmscale" deck.ini \
      --run.output=out.h5 --train.steps=1000000 --train.log_every=1 --model.d_model=64 --model.d_ff=128 \
      --run.progress=false >stdout 2>stderr &
    bg=$!
    wait_for_rows
    rank0=""
    for p in $(pgrep -d ' ' -P "$(pgrep -P "$bg" mpirun)"); do
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=0 && rank0=$p
    done
    check "found rank 0's process" test -n "$rank0"
    fill_disk "$rank0"
    t0=$SECONDS
    wait_for_exit "$bg" 80; bg=""
    dt=$((SECONDS - t0))
    check "the job ended within 30 s of the failure (took ${dt}s; rc $rc, 124 = hung until timeout)" test "$dt" -le 30
    check "exit code $rc, expected 1" test "$rc" -eq 1
    check "rank 0's error line names the file and the errno" \
      bash -c "grep 'lmscale: rank 0: error:' stderr | grep -F \"out.h5.tmp\" | grep -qF 'errno 27, EFBIG'" ;;
  tokens_truncated_midrun)   # the token file is truncated while the run reads it: an error, not SIGBUS
    head -c 40000 /dev/zero >tok.bin
    # test-only fault injection (jobs/fault_injection.h): rank 0 sleeps 3 s at the start of step 3
    LMSCALE_FAULT_SLEEP_RANK=0 LMSCALE_FAULT_SLEEP_STEP=3 LMSCALE_FAULT_SLEEP_S=3 \
      "$lmscale" deck.ini --run.output=out.h5 --train.steps=6 --data.source=tokens --data.path=tok.bin \
      >stdout 2>stderr &
    bg=$!
    for _ in $(seq 300); do
      grep -q 'fault injection' stderr && break
      sleep 0.1
    done
    : >tok.bin   # the same file, now empty
    wait_for_exit "$bg" 60; bg=""
    check "exit code $rc, expected 1 (135 = SIGBUS)" test "$rc" -eq 1
    check "an error line names data.path, the file and what happened" \
      bash -c "grep 'lmscale: rank 0: error:' stderr | grep -F data.path | grep -F tok.bin | grep -qF 'changed under the run'" ;;
  host_memory_refused)   # a model whose parameters alone cannot fit in host memory: refused before allocating
    # (the address-space limit keeps the code before the fix, which allocated first, from taking the machine)
    t0=$SECONDS
    (ulimit -v 8000000; exec timeout 60 "$lmscale" deck.ini --run.output=out.h5 --model.num_layers=100000000 \
      >stdout 2>stderr)
    rc=$?
    dt=$((SECONDS - t0))
    expect_usage_error model.num_layers "per rank" "available"
    check "refused within 10 s (took ${dt}s)" test "$dt" -le 10 ;;
  accounting_huge_depth)   # run.job = accounting of 1e8 blocks: an answer in seconds, memory bounded
    # (the address-space limit keeps the code before the fix, which replayed every block, from
    # taking the machine; the peak must scale with the depth: 2e8 blocks predict twice 1e8's)
    for depth in 100000000 200000000; do
      t0=$SECONDS
      (ulimit -v 4000000; exec timeout 60 "$lmscale" deck.ini --run.job=accounting --run.output=acc_$depth.h5 \
        --model.num_layers=$depth >stdout 2>stderr)
      rc=$?
      dt=$((SECONDS - t0))
      check "$depth blocks: exit code $rc, expected 0" test "$rc" -eq 0
      check "$depth blocks: answered within 10 s (took ${dt}s)" test "$dt" -le 10
      check "$depth blocks: the prediction says it was extrapolated" grep -qF "$depth blocks extrapolated" stdout
    done
    ratio=$(python3 -c "
import h5py
peak = lambda n: max(h5py.File(n)['accounting/memory_phases']['cpu_bytes'])
print(peak('acc_200000000.h5') / peak('acc_100000000.h5'))" 2>&1 | tail -1)
    check "twice the blocks, twice the peak (ratio $ratio)" \
      python3 -c "import sys; sys.exit(0 if abs(float('$ratio') - 2) < 0.01 else 1)" ;;
  full_disk_trace)   # the trace (written at the end) meets a full disk: errno named, no t.rank0.json.tmp
    # rank 0 sleeps 2 s at step 3 (test-only fault injection); then writes past 600 kB fail (fill_disk).
    # The results file (one chunk of 256 rows, 200 kB) stays below that; the trace does not.
    (trap '' XFSZ; LMSCALE_FAULT_SLEEP_RANK=0 LMSCALE_FAULT_SLEEP_STEP=3 LMSCALE_FAULT_SLEEP_S=2 \
      exec "$lmscale" deck.ini --run.output=out.h5 --train.steps=400 --run.trace=t.json --run.progress=false \
      >stdout 2>stderr) &
    bg=$!
    for _ in $(seq 300); do
      grep -q 'fault injection' stderr && break
      sleep 0.1
    done
    prlimit --pid "$bg" --fsize=600000
    wait_for_exit "$bg" 60; bg=""
    check "exit code $rc, expected 1" test "$rc" -eq 1
    check "an error line names run.trace, t.rank0.json.tmp and the errno" \
      bash -c "grep 'lmscale: rank 0: error:' stderr | grep -F run.trace | grep -F t.rank0.json.tmp | grep -qF 'errno 27, EFBIG'"
    check "t.rank0.json.tmp was removed" test ! -e t.rank0.json.tmp
    check "no t.rank0.json" test ! -e t.rank0.json ;;
  checkpoint_dir_bad_name)   # a step folder whose number does not fit 64 bits
    mkdir -p ck/step_99999999999999999999999
    run --train.checkpoint_dir=ck --train.resume=auto
    check "exit code $rc, expected 0 (a fresh start)" test "$rc" -eq 0
    check "a warning names the folder" grep -qF "step_99999999999999999999999" stderr
    check "no 'stoll' in the output" bash -c '! grep -q stoll stderr' ;;
  deck_bom)   # a deck saved with a UTF-8 byte-order mark
    { printf '\xEF\xBB\xBF'; cat deck.ini; } >bom.ini
    DECK=bom.ini run
    check "exit code $rc, expected 0" test "$rc" -eq 0
    check "out.h5 written" is_hdf5 out.h5 ;;
  deck_binary)   # a binary file given as the deck: line number, no raw bytes echoed
    printf '[run]\njob = train\n\xff\xfe\x80\x01 binary\x00\n' >bin.ini
    DECK=bin.ini run
    expect_usage_error "line 3" "not text"
    check "stderr holds only printable ASCII" bash -c '! LC_ALL=C grep -q "[^[:print:][:space:]]" stderr' ;;
  deck_unbalanced_quote)
    sed 's/^log_every = 1$/log_every = 1\nsave = "w.h5/' deck.ini >quote.ini
    DECK=quote.ini run
    expect_usage_error train.save quote
    check "no weights file with a quote in its name" bash -c '! ls | grep -q "w.h5"' ;;
  empty_key_clears)   # --train.save= clears the deck's train.save
    sed 's/^log_every = 1$/log_every = 1\nsave = w.h5/' deck.ini >save.ini
    DECK=save.ini run --train.save=
    check "exit code $rc, expected 0" test "$rc" -eq 0
    check "no weights file written" test ! -e w.h5
    check "out.h5 written" is_hdf5 out.h5 ;;
  resume_step_at_end)   # a checkpoint at (or past) train.steps: nothing left to train
    run --train.checkpoint_dir=ck --train.checkpoint_every=1 --train.steps=3 --train.keep_checkpoints=0
    check "the first run exited $rc" test "$rc" -eq 0
    # resume = auto at exactly train.steps: a completed run requeued; exit 0, and it says so
    rm -f out.h5
    run --train.checkpoint_dir=ck --train.resume=auto --train.steps=3
    check "resume = auto of a completed run: exit $rc, expected 0" test "$rc" -eq 0
    check "it says the run is complete" grep -q "the run is complete, nothing to train" stdout
    # the same checkpoint named explicitly, or with train.steps lowered below it: exit 2
    rm -f out.h5
    run --train.checkpoint_dir=ck --train.resume=ck/step_00000003 --train.steps=3
    expect_usage_error "train.resume = 'ck/step_00000003'" train.steps
    run --train.checkpoint_dir=ck --train.resume=auto --train.steps=2
    expect_usage_error train.resume train.steps ;;
  resume_step_negative)   # an index whose step is negative
    run --train.checkpoint_dir=ck --train.checkpoint_every=1 --train.steps=3 --train.keep_checkpoints=0
    check "the first run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    python3 -c "import h5py; h5py.File('ck/step_00000001/index.h5', 'r+').attrs['step'] = -5" ||
      check "h5py could set the step" false
    run --train.checkpoint_dir=ck --train.resume=ck/step_00000001 --train.steps=3
    expect_usage_error train.resume negative ;;
  rotation_older_resume)   # resuming step 10 into a folder that holds steps 20 and 30
    run --train.checkpoint_dir=ck --train.checkpoint_every=10 --train.steps=30 --train.keep_checkpoints=0 \
      --optim.warmup_steps=1
    check "the first run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    run --train.checkpoint_dir=ck --train.resume=ck/step_00000010 --train.steps=30 --train.checkpoint_every=5 \
      --train.keep_checkpoints=2 --optim.warmup_steps=1
    expect_usage_error train.resume train.checkpoint_dir step_00000020
    for st in 10 20 30; do
      check "ck/step_000000$st is still complete" test -f ck/step_000000$st/index.h5
    done
    check "no new checkpoint was written" test ! -e ck/step_00000015 ;;
  # ---- D: semantic checkpoint validation ---------------------------------------------------------
  resume_weights_rope_theta)   # a weights file of another rope_theta
    run --train.save=w.h5
    check "the weights run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    run --train.resume=w.h5 --model.rope_theta=500000
    expect_usage_error train.resume rope_theta ;;
  resume_weights_more_layers)   # a weights file with more blocks than the deck: not silently cut
    run --train.save=w.h5 --model.num_layers=2
    check "the weights run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    run --train.resume=w.h5
    expect_usage_error train.resume model.num_layers ;;
  resume_sharded_rope_theta)
    run --train.checkpoint_dir=ck
    check "the first run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    run --train.checkpoint_dir=ck --train.resume=auto --train.steps=4 --model.rope_theta=500000
    expect_usage_error train.resume rope_theta ;;
  shard_from_other_step)   # a shard copied from another step's checkpoint
    run --train.checkpoint_dir=ck --train.checkpoint_every=1 --train.steps=3 --train.keep_checkpoints=0
    check "the first run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    cp ck/step_00000001/rank_00000.h5 ck/step_00000003/rank_00000.h5
    run --train.checkpoint_dir=ck --train.resume=ck/step_00000003 --train.steps=4
    expect_usage_error train.resume rank_00000.h5 step ;;
  resume_nonfinite_sharded)   # a NaN in a checkpoint's optimizer state (h5py rewrites the chunk checksum)
    run --train.checkpoint_dir=ck --train.steps=2
    check "the first run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    python3 -c "import h5py; h5py.File('ck/step_00000002/rank_00000.h5', 'r+')['v'][7] = float('nan')" ||
      check "h5py could write the NaN" false
    run --train.checkpoint_dir=ck --train.resume=auto --train.steps=4
    expect_usage_error train.resume rank_00000.h5 non-finite ;;
  resume_nonfinite_weights)   # the same in a weights file's master weights
    run --train.save=w.h5
    check "the weights run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    python3 -c "import h5py; h5py.File('w.h5', 'r+')['lm_head.weight'][1, 2] = float('nan')" ||
      check "h5py could write the NaN" false
    run --train.resume=w.h5
    expect_usage_error train.resume lm_head.weight non-finite ;;
  # ---- E: one rank failing before step 1 --------------------------------------------------------
  rank1_tokens_missing | rank1_tokens_bad_id)   # per-node token files: only rank 1's is bad
    mkdir A B
    head -c 4000 /dev/zero >A/tok.bin
    if [ "$case_name" = rank1_tokens_bad_id ]; then
      head -c 4000 /dev/zero >B/tok.bin
      printf '\xff\x00' | dd of=B/tok.bin bs=1 seek=1000 conv=notrunc status=none
    fi
    args=("$tmp/deck.ini" --data.source=tokens --data.path=tok.bin --run.output="$tmp/out.h5" --parallel.timeout_s=0)
    t0=$SECONDS
    timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 1 -wdir "$tmp/A" "$lmscale" "${args[@]}" : \
      -np 1 -wdir "$tmp/B" "$lmscale" "${args[@]}" >stdout 2>stderr
    rc=$?
    dt=$((SECONDS - t0))
    check "the job ended within 30 s (took ${dt}s; rc $rc, 124 = hung until timeout)" test "$dt" -le 30
    expect_usage_error "rank 1" data.path ;;
  rank1_checkpoint_dir_blocked)   # per-node checkpoint folders: only rank 1's cannot be a folder
    mkdir A B
    echo "a file" >B/ck
    args=("$tmp/deck.ini" --train.checkpoint_dir=ck --run.output="$tmp/out.h5")
    t0=$SECONDS
    timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 1 -wdir "$tmp/A" "$lmscale" "${args[@]}" : \
      -np 1 -wdir "$tmp/B" "$lmscale" "${args[@]}" >stdout 2>stderr
    rc=$?
    dt=$((SECONDS - t0))
    check "the job ended within 30 s (took ${dt}s; rc $rc, 124 = hung until timeout)" test "$dt" -le 30
    expect_usage_error "rank 1" train.checkpoint_dir
    check "rank 0 wrote no checkpoint" test ! -e A/ck/step_00000002 ;;
  rank1_usage_error_midjob)   # a usage error that rank 1 alone finds after the deck checks
    # Rank 1 alone is given a bad test-only variable, which it reads when it builds its trainer,
    # after every agreed check, while rank 0 goes on into the first step's collectives (before
    # the fix rank 1 returned 2 into MPI_Finalize and both hung until killed).
    mkdir A B
    args=("$tmp/deck.ini" --run.output="$tmp/out.h5" --parallel.timeout_s=0 --train.steps=1000000 --run.progress=false)
    t0=$SECONDS
    timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 1 -wdir "$tmp/A" "$lmscale" \
      "${args[@]}" : -np 1 -wdir "$tmp/B" -x LMSCALE_FAULT_SLEEP_RANK=one "$lmscale" "${args[@]}" >stdout 2>stderr
    rc=$?
    dt=$((SECONDS - t0))
    check "the job ended within 15 s (took ${dt}s; rc $rc, 124 = hung until timeout)" test "$dt" -le 15
    check "exit code $rc, expected 2" test "$rc" -eq 2
    check "one 'lmscale: error:' line (got $(grep -c 'lmscale: error:' stderr))" test "$(grep -c 'lmscale: error:' stderr)" -eq 1
    check "it names rank 1 and the variable" error_names "rank 1: " LMSCALE_FAULT_SLEEP_RANK ;;
  rank1_resume_weights_nonfinite)   # per-node copies of train.resume: only rank 1's holds a NaN
    # (found when the weights are read, after the deck checks: before the fix rank 1 returned 2
    # into MPI_Finalize while rank 0 went on into the first step's collectives, and both hung)
    mkdir A B
    run --train.save=A/w.h5
    check "the weights run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    cp A/w.h5 B/w.h5
    python3 -c "import h5py; h5py.File('B/w.h5', 'r+')['lm_head.weight'][1, 2] = float('nan')" ||
      check "h5py could write the NaN" false
    args=("$tmp/deck.ini" --train.resume=w.h5 --run.output="$tmp/out.h5" --parallel.timeout_s=0)
    t0=$SECONDS
    timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 1 -wdir "$tmp/A" "$lmscale" "${args[@]}" : \
      -np 1 -wdir "$tmp/B" "$lmscale" "${args[@]}" >stdout 2>stderr
    rc=$?
    dt=$((SECONDS - t0))
    check "the job ended within 15 s (took ${dt}s; rc $rc, 124 = hung until timeout)" test "$dt" -le 15
    expect_usage_error "rank 1: " train.resume non-finite
    check "one 'lmscale: error:' line (got $(grep -c 'lmscale: error:' stderr))" test "$(grep -c 'lmscale: error:' stderr)" -eq 1 ;;
  # ---- F: messages ---------------------------------------------------------------------------------
  bench_attention_cpu_dtypes)   # bench-attention's defaults (bf16) on a CPU
    run --run.job=bench-attention
    expect_usage_error bench.dtypes fp32 ;;
  preempt_single_file_message)   # SIGTERM with a single-file checkpoint: the resume hint must work
    "$lmscale" deck.ini --run.output=out.h5 --train.steps=1000000 --optim.cosine_steps=100 \
      --train.checkpoint_every=1000000 --train.checkpoint_path=ck.h5 >first.out 2>first.err &
    bg=$!
    for _ in $(seq 300); do
      grep -q '^step' first.out && break
      sleep 0.1
    done
    kill -TERM "$bg"; wait "$bg"; rc=$?; bg=""
    check "SIGTERM: exit $rc, expected 75" test "$rc" -eq 75
    check "the hint names the single-file checkpoint" grep -qF "resume with train.resume = ck.h5" first.out
    stop=$(python3 -c "import h5py; print(int(h5py.File('out.h5')['/train'].attrs['stopped_at_step']))" 2>/dev/null)
    rm -f out.h5
    run --train.resume=ck.h5 --train.steps=$((${stop:-0} + 2)) --optim.cosine_steps=100 \
      --train.checkpoint_every=1000000 --train.checkpoint_path=ck.h5
    check "the hinted resume exited $rc, expected 0" test "$rc" -eq 0
    check "it resumed at step ${stop:-?}" grep -q "resumed from ck.h5 at step ${stop:-x}" stdout ;;
  preempt_mpirun_exit75)   # SIGTERM to the launcher of 2 ranks: exit 75 must reach it
    # (plain mpirun returns 1 here although both ranks exit 75: scripts/mpirun_stoppable.sh)
    "$repo/scripts/mpirun_stoppable.sh" --allow-run-as-root --oversubscribe --bind-to none -np 2 "$lmscale" deck.ini \
      --run.output=out.h5 --train.steps=1000000 --optim.cosine_steps=100 --train.checkpoint_dir=ck \
      --train.checkpoint_every=1000000 >stdout 2>stderr &
    bg=$!
    for _ in $(seq 300); do
      grep -q '^step' stdout && break
      sleep 0.1
    done
    kill -TERM "$bg"
    wait_for_exit "$bg" 60; bg=""
    check "SIGTERM to the launcher: exit $rc, expected 75" test "$rc" -eq 75
    check "a checkpoint was written" bash -c 'ls -d ck/step_* >/dev/null 2>&1'
    check "the results say interrupted" test "$(h5attr out.h5 /train interrupted)" = 1 ;;
  # ---- C: divergence ---------------------------------------------------------------------------
  diverge_stops)   # the loss turns non-finite: stop after train.max_skipped_steps (default 20)
    run --train.steps=200 --optim.lr=1e30 --optim.warmup_steps=0 --train.save=w.h5
    check "exit code $rc, expected 1" test "$rc" -eq 1
    check "an error names train.max_skipped_steps" error_names train.max_skipped_steps
    check "out.h5 (the results up to the stop) is written" is_hdf5 out.h5
    check "/train diverged = 1" test "$(h5attr out.h5 /train diverged)" = 1
    rows=$(python3 -c "import h5py; print(len(h5py.File('out.h5')['/train/steps']))" 2>/dev/null)
    check "fewer rows (${rows:-?}) than train.steps = 200" test "${rows:-200}" -lt 200
    check "no weights saved" test ! -e w.h5 ;;
  diverge_off)   # train.max_skipped_steps = 0: the run goes on to the end as before
    run --train.steps=30 --optim.lr=1e30 --optim.warmup_steps=0 --train.max_skipped_steps=0
    check "exit code $rc, expected 0" test "$rc" -eq 0
    check "/train diverged = 0" test "$(h5attr out.h5 /train diverged)" = 0 ;;
  *) echo "unknown case $case_name"; exit 1 ;;
esac
finish_case
