#!/usr/bin/env bash
# CTest `slurm.cluster`: the project's job scripts against a real (private, one-node) Slurm cluster.
#
#   run_slurm_test.sh LMSCALE_BIN INPUTS_DIR SCRATCH_DIR
#
# Starts slurm/cluster/start.sh, then through slurm/cluster/submit_wait.sh:
#   1. slurm/cpu.sbatch, tiny train deck on 2 MPI ranks -> exit 0, HDF5 /system/ranks has ranks 0,1
#   2. slurm/array.sbatch, a two-line deck list -> exit 0, one HDF5 file per array task
#   3. slurm/cpu.sbatch with a bad value and with an unknown key -> exit 2 reaches the caller
#   4. slurm/gpu_node.sbatch, 2 ranks on a node with 2 GPUs (faked when the machine has none),
#      run with --parallel.device=cpu -> exit 0, ranks 0,1
# and stops the cluster on exit, whatever happened. Exit 77 (skipped) when Slurm/munge/pmix are
# not installed or not root, unless LMSCALE_REQUIRE_SLURM is set (then that is a failure).
# INPUTS_DIR is checked to exist and exported as LMSCALE_INPUTS; the decks used are in decks/.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
t0=$SECONDS
say()  { echo "[slurm-test +$((SECONDS - t0))s] $*"; }
fail() { echo "[slurm-test] FAIL: $*" >&2; exit 1; }

[[ $# -eq 3 ]] || fail "usage: run_slurm_test.sh LMSCALE_BIN INPUTS_DIR SCRATCH_DIR"
bin=$1 inputs=$2 scratch=$3

# ---- skip when the machine cannot run a cluster ----
missing=()
for c in munged mungekey slurmctld slurmd sbatch srun squeue scontrol sinfo; do
  command -v "$c" >/dev/null || missing+=("$c")
done
compgen -G "/usr/lib/*/pmix2/lib/libpmix.so" >/dev/null || compgen -G "/usr/lib*/pmix*/lib/libpmix.so" >/dev/null \
  || missing+=("libpmix.so (libpmix-dev)")
[[ $(id -u) -eq 0 ]] || missing+=("root")
if [[ ${#missing[@]} -gt 0 ]]; then
  msg="cannot run a local Slurm cluster, missing: ${missing[*]} (scripts/deps/slurm.sh installs the packages)"
  [[ -n ${LMSCALE_REQUIRE_SLURM:-} ]] && fail "$msg (LMSCALE_REQUIRE_SLURM is set)"
  echo "[slurm-test] SKIP: $msg"
  exit 77
fi

[[ -x $bin ]] || fail "no executable lmscale at '$bin'"
[[ -d $inputs ]] || fail "no inputs folder '$inputs'"
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
export LMSCALE_BIN=$bin LMSCALE_INPUTS=$inputs LMSCALE_ROOT=$repo
rm -rf "$scratch"; mkdir -p "$scratch" || fail "cannot create scratch dir '$scratch'"
S=$(cd "$scratch" && pwd)
decks=$here/decks
submit=$repo/slurm/cluster/submit_wait.sh
export SUBMIT_WAIT_TIMEOUT=${SUBMIT_WAIT_TIMEOUT:-45}

# ---- HDF5 check: ranks listed in /system/ranks ----
py=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import h5py' 2>/dev/null; then py=$p; break; fi
done
ranks_in() {  # FILE -> sorted rank values, one line, space separated
  if [[ -n $py ]]; then
    "$py" - "$1" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    print(" ".join(str(int(r)) for r in sorted(f["/system/ranks"]["rank"])))
PY
  else  # h5dump: find the position of member "rank", then pick that value out of each record
    h5dump -d /system/ranks "$1" | awk '
      function braces(l,  o, c) { o = gsub(/\{/, "{", l); c = gsub(/\}/, "}", l); return o - c }
      /DATATYPE[[:space:]]+H5T_COMPOUND/ { intype = 1; depth = 0 }
      intype { depth += braces($0)
               if (depth == 1 && $0 ~ /"[^"]*";[[:space:]]*$/) {
                 nm = $0; sub(/";[[:space:]]*$/, "", nm); sub(/.*"/, "", nm); n++; if (nm == "rank") pos = n }
               if (depth == 0) intype = 0
               next }
      /^[[:space:]]*DATA[[:space:]]*\{/ { indata = 1; next }
      indata && /^[[:space:]]*\([0-9]+\):[[:space:]]*\{/ { rdepth = 1; k = 0; next }
      indata && rdepth > 0 { before = rdepth; rdepth += braces($0)
               if (before == 1 && rdepth >= 1) { k++; if (k == pos) { v = $0; gsub(/[[:space:],{]/, "", v); print v } } }
      ' | sort -n | tr '\n' ' ' | sed 's/ $//'
  fi
}
check_ranks() {  # FILE "0 1"
  [[ -f $1 ]] || fail "missing output $1"
  local got; got=$(ranks_in "$1") || fail "cannot read /system/ranks of $1"
  [[ $got == "$2" ]] || fail "$1: /system/ranks has ranks '$got', expected '$2'"
  say "ok: $(basename "$1") /system/ranks = {$got}"
}

# ---- cluster ----
D=""
cleanup() {
  local rc=$?
  if [[ $rc -ne 0 && -n $D && -d $D/log ]]; then
    for f in "$D"/log/slurmctld.log "$D"/log/slurmd.log; do
      [[ -s $f ]] && { echo "===== $f (last 40 lines)"; tail -n 40 "$f"; }
    done
  fi
  if [[ -n $D ]]; then "$repo/slurm/cluster/stop.sh" "$D"; say "cluster stopped"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Two GPUs in the node: real ones if the machine has at least two, fake device files if it has
# none (enough to schedule gpu_node.sbatch), no GPU step with exactly one.
ngpu=$(compgen -G "/dev/nvidia[0-9]*" | wc -l)
gpus=0
(( ngpu >= 2 || ngpu == 0 )) && gpus=2
D=$(SLURM_GPUS=$gpus "$repo/slurm/cluster/start.sh") || { D=""; fail "could not start the cluster"; }
# shellcheck disable=SC1091
source "$D/env"
say "cluster up in $D; lmscale = $bin"

# A machine with fewer than 2 CPUs still runs 2 ranks.
extra=()
(( $(nproc) < 2 )) && extra+=(--overcommit)

show_out() { for f in "$@"; do [[ -f $f ]] && { echo "----- $f"; cat "$f"; }; done; }

# 1. CPU job, 2 ranks
rc=0; "$submit" "$repo/slurm/cpu.sbatch" --ntasks=2 "${extra[@]}" --output="$S/cpu-%j.out" \
  -- "$decks/tiny_train.ini" "$S/out/cpu" >/dev/null || rc=$?
if [[ $rc -ne 0 ]]; then show_out "$S"/cpu-*.out; fail "cpu.sbatch exited $rc, expected 0"; fi
grep -q '== resolved configuration' "$S"/cpu-*.out || { show_out "$S"/cpu-*.out; fail "cpu.sbatch did not print the configuration"; }
shopt -s nullglob
h5=("$S"/out/cpu/tiny_train-*.h5)
[[ ${#h5[@]} -eq 1 ]] || { show_out "$S"/cpu-*.out; fail "expected one HDF5 file in $S/out/cpu, found ${#h5[@]}"; }
check_ranks "${h5[0]}" "0 1"
say "ok: cpu.sbatch, 2 ranks"

# 2. job array over two decks (one rank each, so both tasks run at once)
printf '# two tiny decks\n%s\n\n%s\n' "$decks/tiny_train.ini" "$decks/tiny_train_b.ini" > "$S/decks.txt"
rc=0; "$submit" "$repo/slurm/array.sbatch" --array=0-1 --ntasks=1 --output="$S/array-%A_%a.out" \
  -- "$S/decks.txt" "$S/out/array" >/dev/null || rc=$?
if [[ $rc -ne 0 ]]; then show_out "$S"/array-*.out; fail "array.sbatch exited $rc, expected 0"; fi
a0=("$S"/out/array/tiny_train-*_0.h5) a1=("$S"/out/array/tiny_train_b-*_1.h5)
[[ ${#a0[@]} -eq 1 && ${#a1[@]} -eq 1 ]] || { show_out "$S"/array-*.out; ls -l "$S/out/array" >&2; fail "array outputs missing"; }
check_ranks "${a0[0]}" "0"
check_ranks "${a1[0]}" "0"
say "ok: array.sbatch, 2 tasks"

# 3. bad decks: exit code 2 must reach the submitter
n=0
for bad in --model.d_model=-3 --model.no_such_key=1; do
  n=$((n + 1))
  rc=0; "$submit" "$repo/slurm/cpu.sbatch" --ntasks=2 "${extra[@]}" --output="$S/bad$n-%j.out" \
    -- "$decks/tiny_train.ini" "$S/out/bad" "$bad" >/dev/null || rc=$?
  if [[ $rc -ne 2 ]]; then show_out "$S"/bad$n-*.out; fail "cpu.sbatch with $bad exited $rc, expected 2"; fi
  say "ok: $bad -> exit 2"
done
[[ -z $(compgen -G "$S/out/bad/*.h5") ]] || fail "a rejected deck wrote results"

# 4. GPU node script: 2 ranks with 2 GPUs on the node; run on the CPU (--parallel.device=cpu
#    overrides the script's cuda default) so it needs no real GPU.
if (( gpus == 2 )); then
  rc=0; "$submit" "$repo/slurm/gpu_node.sbatch" --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=1 \
    "${extra[@]}" --output="$S/gpu-%j.out" -- "$decks/tiny_train.ini" "$S/out/gpu" --parallel.device=cpu >/dev/null || rc=$?
  if [[ $rc -ne 0 ]]; then show_out "$S"/gpu-*.out; fail "gpu_node.sbatch exited $rc, expected 0"; fi
  g=("$S"/out/gpu/tiny_train-*.h5)
  [[ ${#g[@]} -eq 1 ]] || { show_out "$S"/gpu-*.out; fail "gpu_node.sbatch wrote no HDF5 file"; }
  check_ranks "${g[0]}" "0 1"
  say "ok: gpu_node.sbatch, 2 ranks x 2 GPUs"
else
  say "gpu_node.sbatch not tried: the machine has exactly one GPU"
fi

say "PASS"
