#!/usr/bin/env bash
# Bad inputs and output targets through the real executable (issue 22). Each case builds what it
# needs in a fresh temporary folder, runs `lmscale` on a tiny train deck and checks the exit code,
# the `lmscale: ... error:` line and what is left on disk.
# Usage: check_io_safety.sh LMSCALE CASE
#   output_fifo output_directory output_not_hdf5 output_dir_blocked tmp_is_fifo save_fifo
#   checkpoint_fifo tokens_short tokens_odd_bytes tokens_bad_id val_tokens_bad_id resume_not_hdf5
#     -> exit 2 naming the key, the target untouched, no out.h5 and no out.h5.tmp
#   output_replaces_hdf5 -> exit 0: an existing HDF5 file (and an empty file) at run.output is replaced
#   partial_after_rows -> exit 1 after rows were written: the message names the kept out.h5.tmp
set -u
lmscale=$1
case_name=$2
# tmp (the working folder, removed at exit with the background run $bg), check and deck.ini: the
# reliability cases' shared set-up.
source "$(dirname "$0")/../regression/reliability_common.sh"

# A token file of N uint16 ids, all below 64.
tokens() { head -c $(($1 * 2)) /dev/zero >"$2"; }
out="$tmp/out.h5"
args=()
expect_rc=2
expect=""
target=""   # a path that must be left exactly as the case made it

case "$case_name" in
  output_fifo) mkfifo "$out"; target=$out; expect="run.output" ;;
  output_directory) mkdir "$out"; target=$out; expect="run.output" ;;
  output_not_hdf5) echo "my notes" >"$out"; target=$out; expect="run.output" ;;
  output_dir_blocked)
    echo "a file" >"$tmp/file"; target="$tmp/file"; expect="run.output"
    out="$tmp/file/sub/out.h5" ;;
  tmp_is_fifo) mkfifo "$out.tmp"; target="$out.tmp"; expect="run.output" ;;
  save_fifo) mkfifo "$tmp/w.h5"; target="$tmp/w.h5"; expect="train.save"; args+=(--train.save="$tmp/w.h5") ;;
  checkpoint_fifo)
    mkfifo "$tmp/ck.h5"; target="$tmp/ck.h5"; expect="train.checkpoint_path"
    args+=(--train.checkpoint_every=1 --train.checkpoint_path="$tmp/ck.h5") ;;
  tokens_short)
    tokens 9 "$tmp/t.bin"; expect="data.path"
    args+=(--data.source=tokens --data.path="$tmp/t.bin") ;;
  tokens_odd_bytes)
    tokens 100 "$tmp/t.bin"; printf 'x' >>"$tmp/t.bin"; expect="data.path"
    args+=(--data.source=tokens --data.path="$tmp/t.bin") ;;
  tokens_bad_id)
    tokens 1000 "$tmp/t.bin"; printf '\x40\x00' | dd of="$tmp/t.bin" bs=1 seek=1500 conv=notrunc status=none
    expect="data.path"; args+=(--data.source=tokens --data.path="$tmp/t.bin") ;;
  val_tokens_bad_id)
    tokens 1000 "$tmp/t.bin"; tokens 1000 "$tmp/v.bin"
    printf '\xff\xff' | dd of="$tmp/v.bin" bs=1 seek=0 conv=notrunc status=none
    expect="data.val_path"; args+=(--data.source=tokens --data.path="$tmp/t.bin" --data.val_path="$tmp/v.bin") ;;
  resume_not_hdf5) echo "not a checkpoint" >"$tmp/ck.h5"; expect="train.resume"; args+=(--train.resume="$tmp/ck.h5") ;;
  output_replaces_hdf5) expect_rc=0 ;;
  partial_after_rows) expect_rc=1 ;;
  *) echo "unknown case $case_name"; exit 1 ;;
esac
before_type=$([ -n "$target" ] && stat -c %F "$target")
before_sum=$([ -n "$target" ] && [ -f "$target" ] && md5sum <"$target")

run() { timeout 120 "$lmscale" "$tmp/deck.ini" --run.output="$out" "${args[@]}" "$@" >"$tmp/stdout" 2>"$tmp/stderr"; }

if [ "$case_name" = output_replaces_hdf5 ]; then
  run; rc=$?
  check "the first run writes an HDF5 out.h5" bash -c "head -c 4 '$out' | grep -q HDF"
  inode=$(stat -c %i "$out" 2>/dev/null)
  if [ "$rc" -eq 0 ]; then
    run; rc=$?
    check "the second run replaces out.h5 (a new file: inode $inode -> $(stat -c %i "$out"))" \
      test "$(stat -c %i "$out")" != "$inode"
  fi
  if [ "$rc" -eq 0 ]; then
    : >"$tmp/empty.h5"
    out="$tmp/empty.h5"
    run; rc=$?
    check "an empty file at run.output is replaced by the results" bash -c "head -c 4 '$out' | grep -q HDF"
  fi
elif [ "$case_name" = partial_after_rows ]; then
  # Training on a token file that turns bad during the run (every id 65535 >= vocab 64): the next
  # sample fails at run time, after the first rows were written.
  tokens 4096 "$tmp/t.bin"
  args+=(--data.source=tokens --data.path="$tmp/t.bin" --train.steps=1000000)
  run &
  bg=$!
  for _ in $(seq 600); do
    grep -q '^step' "$tmp/stdout" 2>/dev/null && break
    kill -0 "$bg" 2>/dev/null || break
    sleep 0.1
  done
  head -c 8192 /dev/zero | tr '\0' '\377' | dd of="$tmp/t.bin" conv=notrunc status=none
  wait "$bg"; rc=$?
  bg=""
  check "the kept file is named: 'kept in '$out.tmp''" grep -qF "kept in '$out.tmp'" "$tmp/stderr"
  check "the runtime error names the token file" grep -qF "model.vocab_size" "$tmp/stderr"
  check "out.h5.tmp is kept" test -s "$out.tmp"
  check "out.h5 is not written" test ! -e "$out"
else
  run; rc=$?
fi

check "exit code ${rc:-?}, expected $expect_rc" test "${rc:-99}" -eq "$expect_rc"
if [ -n "$expect" ]; then
  check "a 'lmscale: error:' line names '$expect'" bash -c "grep -F 'lmscale: error:' '$tmp/stderr' | grep -qF -- '$expect'"
fi
if [ "$expect_rc" -eq 2 ]; then
  for f in "$tmp/out.h5" "$tmp/out.h5.tmp" "$out" "$out.tmp"; do
    [ "$f" = "$target" ] && continue
    check "$f was not created" test ! -e "$f"
  done
fi
if [ -n "$target" ]; then
  check "$target is still $before_type" test "$(stat -c %F "$target")" = "$before_type"
  [ -n "$before_sum" ] && check "$target is unchanged" test "$(md5sum <"$target")" = "$before_sum"
fi
echo "--- stderr:"; cat "$tmp/stderr"
echo "--- stdout (tail):"; tail -5 "$tmp/stdout"
[ "$fail" -eq 0 ] && echo "PASS: $case_name"
exit "$fail"
