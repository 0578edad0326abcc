#!/usr/bin/env bash
# Reliability cases of issue 36 about the checkpoint directory and the files a run resumes or
# prunes from (docs/reliability.md has the table): one run per train.checkpoint_dir, newer
# checkpoints moved aside, shard layouts against their index, resume and prune inputs against the
# deck's model keys, an unwritable checkpoint directory named as the user wrote it. Same conventions as reliability.sh
# (a fresh temporary folder, a tiny CPU train deck, every run bounded by `timeout`).
# Usage: reliability_checkpoints.sh LMSCALE CASE
set -u
lmscale=$1
case_name=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/ctest/regression/reliability_common.sh"

# dead_pid: the id of a process that has ended (a lock file left by it is stale).
dead_pid() {
  sleep 0 &
  local pid=$!
  wait "$pid"
  echo "$pid"
}

case "$case_name" in
  concurrent_checkpoint_dir)   # a second run writing the same train.checkpoint_dir while the first runs
    "$lmscale" deck.ini --run.output=first.h5 --train.steps=1000000 --optim.cosine_steps=100 \
      --train.checkpoint_dir=ck --train.checkpoint_every=1000000 >first.out 2>first.err &
    bg=$!
    wait_for_line first.out "step"
    check "the first run holds ck/lmscale.lock" grep -q "pid=$bg" ck/lmscale.lock
    # another spelling of the same folder, another results file
    run --train.checkpoint_dir=./ck/ --train.resume=auto
    check "exit code $rc, expected 2" test "$rc" -eq 2
    check "an 'lmscale: error:' line names train.checkpoint_dir and the first run's pid $bg" \
      error_names train.checkpoint_dir "pid=$bg" checkpoints
    check "out.h5 was not created" test ! -e out.h5
    check "the first run is still running" kill -0 "$bg"
    kill -TERM "$bg"; wait "$bg"; bg_rc=$?; bg=""
    check "the first run ended with exit $bg_rc, expected 75 (interrupted, checkpoint written)" test "$bg_rc" -eq 75
    check "its checkpoint is complete" bash -c 'ls ck/step_*/index.h5 >/dev/null 2>&1'
    check "the lock file is gone" test ! -e ck/lmscale.lock
    # now the folder is free: the second run resumes it
    last=$(ls -d ck/step_* | tail -1)
    run --train.checkpoint_dir=./ck/ --train.resume=auto --train.steps=$((10#${last##*_} + 2)) --optim.cosine_steps=100
    check "the next run exited $rc, expected 0" test "$rc" -eq 0 ;;
  checkpoint_dir_stale_lock)   # a lock file left by a process that is gone (kill -9): taken over with a note
    mkdir ck
    stale=$(dead_pid)
    echo "lmscale-lock pid=$stale host=$(hostname)" >ck/lmscale.lock
    run --train.checkpoint_dir=ck
    check "exit code $rc, expected 0" test "$rc" -eq 0
    check "a note names the stale holder (pid $stale)" \
      bash -c "grep 'lmscale: note:' stderr | grep -F train.checkpoint_dir | grep -qF 'pid $stale'"
    check "the checkpoint was written" test -f ck/step_00000002/index.h5
    check "the lock file is gone" test ! -e ck/lmscale.lock ;;
  checkpoint_dir_lock_noflock)   # a file system without flock: the lock file's content is the lock
    # (test-only: LMSCALE_TEST_NO_FLOCK=1 makes flock fail with ENOLCK, as on such a mount)
    export LMSCALE_TEST_NO_FLOCK=1
    mkdir ck
    sleep 120 &
    holder=$!
    echo "lmscale-lock pid=$holder host=$(hostname)" >ck/lmscale.lock
    run --train.checkpoint_dir=ck
    check "a live holder on this host: exit $rc, expected 2" test "$rc" -eq 2
    check "the error names train.checkpoint_dir and the holder" error_names train.checkpoint_dir "pid=$holder"
    check "the holder's lock file is kept" grep -q "pid=$holder" ck/lmscale.lock
    kill "$holder"; wait "$holder" 2>/dev/null
    run --train.checkpoint_dir=ck
    check "the holder gone: exit $rc, expected 0" test "$rc" -eq 0
    check "a note names the stale holder" bash -c "grep 'lmscale: note:' stderr | grep -qF 'pid $holder'"
    check "a warning says flock is missing" bash -c "grep 'lmscale: warning:' stderr | grep -qF 'cannot lock'"
    rm -f out.h5
    echo "lmscale-lock pid=1 host=another-node.invalid" >ck/lmscale.lock
    run --train.checkpoint_dir=ck --train.resume=auto --train.steps=3
    check "a holder on another host: exit $rc, expected 2" test "$rc" -eq 2
    check "the error names the other host and says to remove the lock if it is gone" \
      error_names train.checkpoint_dir another-node.invalid "another host" remove ;;
  rotation_older_resume_move_aside)   # resuming step 10 with steps 20 and 30 present, move-aside
    run --train.checkpoint_dir=ck --train.checkpoint_every=10 --train.steps=30 --train.keep_checkpoints=0 \
      --optim.warmup_steps=1
    check "the first run exited $rc" test "$rc" -eq 0
    old30=$(md5sum <ck/step_00000030/rank_00000.h5)
    rm -f out.h5
    run --train.checkpoint_dir=ck --train.resume=ck/step_00000010 --train.steps=30 --train.checkpoint_every=5 \
      --train.keep_checkpoints=2 --optim.warmup_steps=1 --train.on_newer_checkpoints=move-aside --optim.lr=2e-3
    check "exit code $rc, expected 0" test "$rc" -eq 0
    aside=$(ls -d ck/superseded-* 2>/dev/null | head -1)
    check "a superseded-<time> folder was made" test -n "$aside"
    for st in 20 30; do
      check "$aside/step_000000$st is complete" test -f "$aside/step_000000$st/index.h5"
    done
    check "the moved step_30 is the old one" test "$(md5sum <"$aside/step_00000030/rank_00000.h5")" = "$old30"
    check "the new lineage's step_30 is there and differs" \
      bash -c "test -f ck/step_00000030/index.h5 && test \"\$(md5sum <ck/step_00000030/rank_00000.h5)\" != '$old30'"
    check "rotation kept the new lineage (step_25, step_30)" test -f ck/step_00000025/index.h5
    check "the run said what it moved" bash -c "grep -F 'move-aside' stdout | grep -F step_00000020 | grep -qF superseded-"
    # train.resume = auto now continues the new lineage, and never looks into the superseded folder
    rm -f out.h5
    run --train.checkpoint_dir=ck --train.resume=auto --train.steps=32 --optim.warmup_steps=1
    check "resume = auto exited $rc, expected 0" test "$rc" -eq 0
    check "it resumed the new step_30" grep -qF "resumed from ck/step_00000030 at step 30" stdout ;;
  shard_piece_table_altered)   # a rank file whose piece table is not the index's: its layout is checked
    run --train.checkpoint_dir=ck --train.steps=2
    check "the first run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    python3 -c "import h5py; f = h5py.File('ck/step_00000002/rank_00000.h5', 'r+'); f['pieces/offset'][1] += 8" ||
      check "h5py could alter the piece table" false
    run --train.checkpoint_dir=ck --train.resume=auto --train.steps=4
    expect_usage_error train.resume rank_00000.h5 "pieces other than its index" ;;
  prune_weights_model_keys)   # prune.weights written with another rope_theta, num_heads or norm_eps
    run --train.save=w.h5 --train.steps=3
    check "the weights run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    prune=(--run.job=prune --prune.weights=w.h5 --prune.output=p.h5 --prune.target_sparsity=0.5
      --prune.finetune_steps=1)
    run "${prune[@]}" --model.rope_theta=500000
    expect_usage_error prune.weights model.rope_theta
    run "${prune[@]}" --model.num_heads=4
    expect_usage_error prune.weights model.num_heads
    run "${prune[@]}" --model.norm_eps=1e-6
    expect_usage_error prune.weights model.norm_eps
    check "no pruned weights were written" test ! -e p.h5
    run "${prune[@]}"
    check "the same prune with the writer's keys exited $rc, expected 0" test "$rc" -eq 0 ;;
  checkpoint_dir_not_writable)   # a checkpoint directory that cannot be written: the user's path in the error
    echo "a file" >afile
    run --train.checkpoint_dir=afile/ck
    expect_usage_error "train.checkpoint_dir = 'afile/ck'" "not a directory"
    check "no internal path (step_00000000) in the error" bash -c '! grep -q step_00000000 stderr'
    # a read-only folder (root, as CI runs, writes anywhere: tested for other users only)
    if [ "$(id -u)" -ne 0 ]; then
      mkdir ro && chmod 555 ro
      run --train.checkpoint_dir=ro
      expect_usage_error "train.checkpoint_dir = 'ro'" "cannot write"
      check "no internal path (step_00000000) in the error" bash -c '! grep -q step_00000000 stderr'
    fi ;;
  resume_norm_eps_sharded)   # a sharded checkpoint of another model.norm_eps (the index's config)
    run --train.checkpoint_dir=ck --model.norm_eps=1e-6
    check "the first run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    run --train.checkpoint_dir=ck --train.resume=auto --train.steps=4
    expect_usage_error train.resume index.h5 "model.norm_eps = 1e-06" "deck has 1e-05" "set model.norm_eps = 1e-06"
    run --train.checkpoint_dir=ck --train.resume=auto --train.steps=4 --model.norm_eps=1e-6
    check "the resume with the writer's norm_eps exited $rc, expected 0" test "$rc" -eq 0 ;;
  resume_norm_eps_single_file)   # a single-file checkpoint (optimizer state) of another norm_eps
    run --train.checkpoint_every=1 --train.checkpoint_path=c.h5 --model.norm_eps=1e-6
    check "the first run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    run --train.resume=c.h5 --train.steps=4
    expect_usage_error train.resume c.h5 "model.norm_eps = 1e-06" "deck has 1e-05" "set model.norm_eps = 1e-06" ;;
  resume_norm_eps_weights)   # an HDF5 weights file (train.save) of another norm_eps
    run --train.save=w.h5 --model.norm_eps=1e-6
    check "the weights run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    run --train.resume=w.h5
    expect_usage_error train.resume w.h5 "model.norm_eps = 1e-06" "deck has 1e-05" "set model.norm_eps = 1e-06" ;;
  resume_safetensors_model_keys)   # safetensors metadata is text: num_heads and norm_eps compared too
    run --train.save=w.safetensors
    check "the weights run exited $rc" test "$rc" -eq 0
    rm -f out.h5
    run --train.resume=w.safetensors --model.num_heads=4
    expect_usage_error train.resume w.safetensors "model.num_heads = 2" "deck has 4" "set model.num_heads = 2"
    run --train.resume=w.safetensors --model.norm_eps=1e-6
    expect_usage_error train.resume w.safetensors "model.norm_eps = 1e-05" "deck has 1e-06"
    run --train.resume=w.safetensors
    check "the resume with the writer's keys exited $rc, expected 0" test "$rc" -eq 0 ;;
  *) echo "unknown case $case_name"; exit 1 ;;
esac
finish_case
