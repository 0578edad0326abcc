#!/usr/bin/env bash
# accounting_anywhere.sh LMSCALE DECK_8B OUTDIR
# run.job = accounting plans a run, whatever this machine is (issue 38): the 8B GPU deck
# (parallel.device = cuda, backend = nccl, bf16) runs here without a GPU and without mpirun;
# accounting.world = 2 plans its 2-rank run, the header says "2 ranks", the CUDA peak per rank is
# the 107.93 GiB the accounting gives on the GPU machine (docs/performance.md), and
# accounting.device picks the device the peak is judged against (an H100 80GB: does not fit; an
# H200: fits, 77%). A planned world that contradicts the layout is exit 2 naming the key. With
# mpirun, the launched ranks are the planned world.
set -uo pipefail
lmscale=$1 deck=$2 out=$3
mkdir -p "$out"; cd "$out" || exit 1
fail=0
run() {   # NAME WANT_RC ARGS...
  local name=$1 want=$2; shift 2
  "$lmscale" "$deck" --run.job=accounting --run.output="$name.h5" "$@" > "$name.log" 2>&1
  local rc=$?
  if [[ $rc -ne $want ]]; then echo "FAIL $name: exit $rc, expected $want"; tail -5 "$name.log"; fail=1; return 1; fi
  echo "ok $name (exit $rc)"
}
expect() {   # NAME REGEX: a line of NAME.log matches
  grep -Eq "$2" "$1.log" || { echo "FAIL $1: no line matches '$2'"; head -3 "$1.log"; fail=1; }
}
peak_gib() {   # NAME: /accounting predicted_peak_bytes_cuda in GiB, 2 decimals, and the planned world
  python3 -c "
import h5py, sys
a = h5py.File(sys.argv[1], 'r')['/accounting'].attrs
print(f\"{a['predicted_peak_bytes_cuda'] / 2**30:.2f} {int(a['world'])}\")" "$1.h5"
}

if run h200 0 --accounting.world=2 --accounting.device=h200; then
  expect h200 "^accounting: .* 2 ranks planned on NVIDIA H200,"
  expect h200 "^peak +[0-9.]+ +107\.9(2[5-9]|3[0-4])$"   # 107.93 GiB to 2 decimals
  expect h200 "^on NVIDIA H200 \(140\.40 GiB; .*\): the peak of 107\.93 GiB per rank fits \(77% of the device\)"
  got=$(peak_gib h200); [[ $got == "107.93 2" ]] || { echo "FAIL h200: file says '$got', expected '107.93 2'"; fail=1; }
fi
if run h100 0 --accounting.world=2 --accounting.device=h100-80gb; then
  expect h100 "^accounting: .* 2 ranks planned on NVIDIA H100 80GB HBM3,"
  expect h100 "the peak of 107\.93 GiB per rank does NOT fit"
fi
# The deck's own device (cuda) on a machine that may have no GPU: planned, not refused.
if run auto 0 --accounting.world=2; then
  expect auto "^accounting: .* 2 ranks planned on "
  got=$(peak_gib auto); [[ $got == "107.93 2" ]] || { echo "FAIL auto: file says '$got', expected '107.93 2'"; fail=1; }
fi
# parallel.dp alone plans dp x tp x pp ranks (the header used to say 1).
if run dp2 0 --parallel.dp=2 --accounting.device=h200; then expect dp2 "^accounting: .* 2 ranks planned on"; fi
run world3_tp2 2 --accounting.world=3 --parallel.tp=2 && expect world3_tp2 "accounting.world = 3 is not a multiple of"
run world4_dp2 2 --accounting.world=4 --parallel.dp=2 && expect world4_dp2 "accounting.world = 4 but parallel.dp"
for f in world3_tp2.h5 world4_dp2.h5; do [[ -e $f ]] && { echo "FAIL: $f written by a refused deck"; fail=1; }; done
if command -v mpirun > /dev/null; then
  mpirun -np 2 --bind-to none "$lmscale" "$deck" --run.job=accounting --accounting.device=h200 \
    --run.output=np2.h5 > np2.log 2>&1 || { echo "FAIL np2: exit $?"; tail -5 np2.log; fail=1; }
  expect np2 "^accounting: .* 2 ranks planned on NVIDIA H200,"
  [[ $(grep -c "^accounting:" np2.log) -eq 1 ]] || { echo "FAIL np2: the header is not printed once"; fail=1; }
fi
[[ $fail -eq 0 ]] && echo PASS
exit $fail
