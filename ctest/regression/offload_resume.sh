#!/usr/bin/env bash
# offload_resume.sh LMSCALE DECK OUTDIR
# parallel.offload = optimizer (docs/parallel.md) with sharded checkpoints, on the tiny deck (CPU):
#   A  zero2 on 2, offload none, 8 steps, checkpoint every 4        = the uninterrupted run
#   B  zero2 on 2 with offload resumes A's step 4  -> A's losses, bitwise
#   C  zero2 on 2 with offload from the start, checkpoint every 4 -> A's losses, bitwise
#   D  zero2 on 2 without offload resumes C's step 4 -> A's losses, bitwise
#   E  one process with offload resumes A's step 4 (resharded) -> within RESHARD_RTOL
#   H, I, J  fsdp with offload: from the start, from A's step 4, and zero2 from H's step 4 -> bitwise
#   P, Q, R  fsdp with optimizer+params: from the start (checkpointing), from H's step 4, and fsdp
#            with offload = optimizer from P's step 4 -> bitwise
#   S, T  fsdp with optimizer+params and the one-step-delayed update: from the start, and from A's
#         step 4 (the first step bitwise as A's, the next one update behind)
#   F  each refusal: exit 2 naming the key, no results file
#   M, K  predicted memory = measured (CPU; M4-M6 optimizer+params), and the accounting of the 8b
#         offload deck (K2: with optimizer+params)
set -euo pipefail
lmscale=$1 deck=$2 out=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rtol=${RESHARD_RTOL:-1e-5}
rm -rf "$out/offload"; mkdir -p "$out/offload"; cd "$out/offload"
mpi() { local np=$1; shift; mpirun --oversubscribe --allow-run-as-root --bind-to none -np "$np" "$lmscale" "$deck" "$@"; }
common=(--optim.cosine_steps=8 --train.steps=8 --optim.weight_decay=0.1)

same_tail() {  # RUN FIRST: RUN's losses equal A's from step FIRST on, bit for bit
  python3 - "$1" "$2" <<'PY'
import h5py, sys
run, first = sys.argv[1], int(sys.argv[2])
with h5py.File("A.h5") as a, h5py.File(run) as b:
    la, lb = list(a["/train/steps"]["loss"][first:]), list(b["/train/steps"]["loss"])
    sys.exit(0 if la == lb else f"FAIL: {run} not bitwise: {la} vs {lb}")
PY
}

mpi 2 "${common[@]}" --parallel.zero=zero2 --run.output=A.h5 --train.checkpoint_dir=ckA --train.checkpoint_every=4
mpi 2 "${common[@]}" --parallel.zero=zero2 --parallel.offload=optimizer --run.output=B.h5 \
  --train.resume=ckA/step_00000004
same_tail B.h5 4
echo "ok: zero2 -> zero2 with offload resumes bitwise"
mpi 2 "${common[@]}" --parallel.zero=zero2 --parallel.offload=optimizer --run.output=C.h5 \
  --train.checkpoint_dir=ckC --train.checkpoint_every=4
same_tail C.h5 0
echo "ok: zero2 with offload from the start = without, bitwise"
mpi 2 "${common[@]}" --parallel.zero=zero2 --run.output=D.h5 --train.resume=ckC/step_00000004
same_tail D.h5 4
echo "ok: zero2 with offload -> zero2 without resumes bitwise"
"$lmscale" "$deck" "${common[@]}" --parallel.offload=optimizer --run.output=E.h5 --train.resume=ckA/step_00000004
python3 - <<'PY'
import h5py, h5py, sys
with h5py.File("A.h5") as a, h5py.File("E.h5") as e:
    la, le = a["/train/steps"]["loss"][4:], e["/train/steps"]["loss"]
    worst = max(abs(x - y) / abs(x) for x, y in zip(la, le))
    sys.exit(0 if len(le) == 4 and worst <= float(__import__("os").environ.get("RESHARD_RTOL", "1e-5")) else f"FAIL: E {list(le)} vs {list(la)}")
PY
echo "ok: zero2 on 2 -> one process with offload"
# FSDP with offload: from the start (bitwise to A: zero2 and fsdp run the same arithmetic on CPU
# ranks), and resumed from A's step 4 (resharded by name).
mpi 2 "${common[@]}" --parallel.zero=fsdp --parallel.offload=optimizer --run.output=H.h5 \
  --train.checkpoint_dir=ckH --train.checkpoint_every=4
same_tail H.h5 0
mpi 2 "${common[@]}" --parallel.zero=fsdp --parallel.offload=optimizer --run.output=I.h5 --train.resume=ckA/step_00000004
same_tail I.h5 4
mpi 2 "${common[@]}" --parallel.zero=zero2 --run.output=J.h5 --train.resume=ckH/step_00000004
same_tail J.h5 4
echo "ok: fsdp with offload = zero2 without, from the start and across resumes, bitwise"
# optimizer+params: the 16-bit shard on the host too; the same checkpoint names.
mpi 2 "${common[@]}" --parallel.zero=fsdp --parallel.offload=optimizer+params --run.output=P.h5 \
  --train.checkpoint_dir=ckP --train.checkpoint_every=4
same_tail P.h5 0
mpi 2 "${common[@]}" --parallel.zero=fsdp --parallel.offload=optimizer+params --run.output=Q.h5 \
  --train.resume=ckH/step_00000004
same_tail Q.h5 4
mpi 2 "${common[@]}" --parallel.zero=fsdp --parallel.offload=optimizer --run.output=R.h5 --train.resume=ckP/step_00000004
same_tail R.h5 4
echo "ok: fsdp with optimizer+params = zero2 without, from the start and across resumes to and from optimizer, bitwise"
# The one-step-delayed update (parallel.offload_delayed_update): step s + 1 reads the parameters
# of step s - 1. The warm-up's first learning rate is 0, so step 1's update changes nothing and
# steps 1 and 2 are A's, bitwise; step 3 reads step 1's result where A reads step 2's, so its loss
# differs; the run still trains (its last loss within 10% of A's on this tiny deck). Resumed from
# A's step 4, both pinned copies start from the saved master: step 5 is A's bitwise, step 6 (which
# reads step 4's parameters again, not step 5's update at a learning rate > 0) differs.
delayed=(--parallel.zero=fsdp --parallel.offload=optimizer+params --parallel.offload_delayed_update=true)
mpi 2 "${common[@]}" "${delayed[@]}" --run.output=S.h5
mpi 2 "${common[@]}" "${delayed[@]}" --run.output=T.h5 --train.resume=ckA/step_00000004
python3 - <<'PY'
import h5py, math, sys
with h5py.File("A.h5") as a, h5py.File("S.h5") as s, h5py.File("T.h5") as t:
    la, ls, lt = (list(f["/train/steps"]["loss"]) for f in (a, s, t))
    bad = []
    lr = list(a["/train/steps"]["lr"])
    if lr[0] != 0 or lr[1] <= 0 or lr[4] <= 0: bad.append(f"the schedule this check assumes changed: {lr}")
    if ls[:2] != la[:2]: bad.append(f"steps 1-2 {ls[:2]} != {la[:2]}")
    if ls[2] == la[2]: bad.append("step 3 equals the synchronous update's")
    if not all(math.isfinite(x) for x in ls) or abs(ls[-1] - la[-1]) > 0.1 * abs(la[-1]):
        bad.append(f"last loss {ls[-1]} against {la[-1]}")
    if lt[0] != la[4]: bad.append(f"resumed step 5 {lt[0]} != {la[4]}")
    if lt[1] == la[5]: bad.append("resumed step 6 equals the synchronous update's")
    sys.exit("FAIL: delayed update: " + "; ".join(bad) if bad else 0)
PY
echo "ok: fsdp with the delayed update: step 1 as without, then one update behind; resumes from the saved master"

expect2() {  # NP WHAT PATTERN ARGS...: exit 2, the message matches PATTERN, no results file
  local np=$1 what=$2 pattern=$3 rc=0 mode=${OFFLOAD_MODE:-optimizer}; shift 3
  rm -f G.h5
  mpi "$np" "${common[@]}" --parallel.offload="$mode" --run.output=G.h5 "$@" > G.log 2>&1 || rc=$?
  [[ $rc -eq 2 ]] || { cat G.log; echo "FAIL: $what: exit $rc, expected 2"; exit 1; }
  grep -q -- "$pattern" G.log || { cat G.log; echo "FAIL: $what: message lacks '$pattern'"; exit 1; }
  [[ ! -e G.h5 && ! -e G.h5.tmp ]] || { echo "FAIL: $what: a results file was written"; exit 1; }
  echo "ok: $what -> exit 2: $(grep -m1 -i error G.log)"
}
expect2 1 "sgd" "optim.name = sgd" --optim.name=sgd
expect2 1 "lamb" "optim.name = lamb" --optim.name=lamb
expect2 2 "zero1-broadcast" "parallel.zero = zero1-broadcast" --parallel.zero=zero1-broadcast
expect2 2 "ddp" "not built yet for DDP" --parallel.ddp=bucketed
expect2 2 "tp" "tensor or pipeline parallelism (parallel.tp = 2" --parallel.tp=2 --model.vocab_size=96
expect2 2 "pp" "tensor or pipeline parallelism (parallel.tp = 1, parallel.pp = 2" --parallel.pp=2
OFFLOAD_MODE=optimizer+params expect2 2 "optimizer+params with zero2" \
  "parallel.offload = optimizer+params puts the parameter shards in host memory, which only parallel.zero = fsdp" \
  --parallel.zero=zero2
OFFLOAD_MODE=optimizer+params expect2 1 "optimizer+params on one process" "(parallel.zero = none)"
OFFLOAD_MODE=optimizer+params expect2 2 "optimizer+params with plan" "parallel.offload = optimizer+params with run.job = plan" \
  --parallel.zero=fsdp --run.job=plan

# Memory: the prediction stored beside each CPU bench-model run equals its measured peak with
# offload (fsdp, zero2, one process), and the accounting job counts the offload (host memory and
# bytes over the bus) and predicts the 8b offload deck's GPU peak measured on 2 H200 and 2 H100
# (75073126404 bytes, docs/performance.md) within 0.1%.
bench_peak() {  # NP NAME ARGS...
  local np=$1 name=$2 mode=${OFFLOAD_MODE:-optimizer}; shift 2
  mpi "$np" --run.job=bench-model --parallel.offload="$mode" --run.output="$name.h5" "$@" > "$name.log" 2>&1
  python3 - "$name.h5" <<'PY'
import h5py, sys
g = h5py.File(sys.argv[1])["bench_model"].attrs
sys.exit(0 if g["peak_bytes"] == g["predicted_peak_bytes"] else f"FAIL: {sys.argv[1]}: measured {g['peak_bytes']} predicted {g['predicted_peak_bytes']}")
PY
  echo "ok: $name: predicted peak = measured"
}
bench_peak 2 M1 --parallel.zero=fsdp
bench_peak 2 M2 --parallel.zero=zero2
bench_peak 1 M3
# optimizer+params: the pinned host copy instead of the device copy, a send buffer per gather; in
# fp32 (CPU ranks have no bf16), with prefetch 1 and 2, and with the weights kept from the forward
# to the backward.
OFFLOAD_MODE=optimizer+params bench_peak 2 M4 --parallel.zero=fsdp
OFFLOAD_MODE=optimizer+params bench_peak 2 M5 --parallel.zero=fsdp --parallel.fsdp_prefetch=2
OFFLOAD_MODE=optimizer+params bench_peak 2 M6 --parallel.zero=fsdp --parallel.reshard_after_forward=false
"$lmscale" "$here/../../inputs/leaderboard_8b_offload.ini" --run.job=accounting --accounting.world=2 \
  --accounting.device=h200 --run.output=K.h5 > K.log
grep -q "offload (optimizer): host memory 45.404 GiB per rank" K.log || { cat K.log; echo "FAIL: accounting: no offload line"; exit 1; }
# The device items keep the gradient shard and the gathered units (the table's total is the
# replay's peak within 1 GiB: 70.50 against 69.90 GiB).
grep -q "^gradient_shard  *15.135" K.log && grep -q "^fsdp_gathered" K.log \
  || { cat K.log; echo "FAIL: accounting: the offloaded fsdp table lacks the gradient shard or the gathers"; exit 1; }
python3 - <<'PY'
import h5py, sys
a = h5py.File("K.h5")["accounting"].attrs
measured = 75073126404
err = abs(a["predicted_peak_bytes_cuda"] - measured) / measured
ok = err < 1e-3 and a["host_bytes_per_rank"] > 4.8e10 and a["host_transfer_bytes_per_step_per_rank"] > 2.4e10
sys.exit(0 if ok else f"FAIL: accounting of the 8b offload deck: {dict(a)}")
PY
echo "ok: accounting counts the offload; the 8b offload deck's GPU peak within 0.1% of the measured"
# optimizer+params on the same deck: the 16-bit shard (2 B per shard element, S = host/12 above)
# moves to the host: host 14 B per element, no parameters_lowp on the device, the GPU peak lower by
# 2S less the one prefetched block's send buffer alive at the peak (< 3% of 2S); the bus carries
# the gradients down and each gather's shard up (more than optimizer's 4 + 2 B, less than 4 + 4 B:
# the backward regathers the blocks, not the head and the embedding).
"$lmscale" "$here/../../inputs/leaderboard_8b_offload.ini" --run.job=accounting --accounting.world=2 \
  --accounting.device=h200 --parallel.offload=optimizer+params --run.output=K2.h5 > K2.log
grep -q "offload (optimizer+params): host memory 52.97" K2.log || { cat K2.log; echo "FAIL: accounting: no optimizer+params line"; exit 1; }
grep -Eq "^parameters_lowp +0.000 +0: the shard's 16-bit copy is in host memory" K2.log || { cat K2.log; echo "FAIL: parameters_lowp"; exit 1; }
python3 - <<'PY'
import h5py, sys
a, b = h5py.File("K.h5")["accounting"].attrs, h5py.File("K2.h5")["accounting"].attrs
S = a["host_bytes_per_rank"] / 12
saved = (a["predicted_peak_bytes_cuda"] - b["predicted_peak_bytes_cuda"]) / (2 * S)
ok = (abs(b["host_bytes_per_rank"] - 14 * S) < 1 and 0.97 < saved <= 1
      and 6 * S < b["host_transfer_bytes_per_step_per_rank"] < 8 * S)
sys.exit(0 if ok else f"FAIL: accounting of optimizer+params: saved {saved} x 2S, {dict(b)}")
PY
echo "ok: accounting of optimizer+params: host 14 B per shard element, the 16-bit shard off the device"
echo "ok: offload_resume"
