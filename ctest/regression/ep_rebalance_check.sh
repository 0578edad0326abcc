#!/usr/bin/env bash
# ep_rebalance_check.sh LMSCALE DECK OUTDIR
# parallel.ep_rebalance_every (docs/moe.md, "Rebalancing the ep ranks") on tiny_moe.ini (fp32, 4
# experts): runs whose experts are relabelled every few steps against one process, which never
# relabels. The model's function does not change, so the losses and gradient norms stay within
# 1e-6, /train/moe's counts are one process's relabelled, and the final weights are one process's
# relabelled (ep_rebalance_check.py); each run must have moved an expert. Layouts: ep = 2 (AdamW),
# dp 2 x ep 2 under zero1 and zero2 with 2 micro-batches, ep = 2 under fsdp, ep = 2 with SGD (an
# optimizer with one state), dense and MoE blocks mixed, and a run relabelled, checkpointed and
# resumed with relabelling. Then
# bench-model's warm-up relabelling (/bench_model/ep_placement) and the keys' refusals (exit 2).
set -euo pipefail
lmscale=$1 deck=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
check="python3 $here/ep_rebalance_check.py"
mkdir -p "$out"
rm -rf "$out"/rb_*
# 8 experts, not the deck's 4: 4 route evenly enough that a relabelling seldom pays (3 ways to split
# them over 2 ranks, 35 for 8).
experts=--model.moe_experts=8
run() {   # run NP NAME ARGS...
  local np=$1 name=$2
  shift 2
  if [ "$np" -gt 1 ]; then
    mpirun --oversubscribe --allow-run-as-root -np "$np" "$lmscale" "$deck" $experts --run.output="$out/rb_$name.h5" "$@" \
      > "$out/rb_$name.log" 2>&1 || { cat "$out/rb_$name.log"; exit 1; }
  else
    "$lmscale" "$deck" $experts --run.output="$out/rb_$name.h5" "$@" > "$out/rb_$name.log" 2>&1 || { cat "$out/rb_$name.log"; exit 1; }
  fi
}
every=--parallel.ep_rebalance_every
run 1 one --train.save="$out/rb_one_weights.h5"
run 2 ep2 --parallel.ep=2 $every=2 --train.save="$out/rb_ep2_weights.h5"
run 4 dp2ep2_zero1 --parallel.ep=2 --parallel.zero=zero1 $every=2 --train.save="$out/rb_dp2ep2_zero1_weights.h5"
run 4 dp2ep2_zero2_accum --parallel.ep=2 --parallel.zero=zero2 --train.grad_accum=2 $every=2
run 2 ep2_fsdp --parallel.ep=2 --parallel.zero=fsdp $every=2 --train.save="$out/rb_ep2_fsdp_weights.h5"
# Dense and MoE blocks mixed (moe_every = 2: block 1 is MoE): the relabelled parameters are found
# by the layout's index, not by position.
run 1 one_mixed --model.moe_every=2
run 2 ep2_mixed --parallel.ep=2 --model.moe_every=2 $every=2
sgd=(--optim.name=sgd --optim.momentum=0.9)
run 1 one_sgd "${sgd[@]}"
run 2 ep2_sgd --parallel.ep=2 "${sgd[@]}" $every=2
for r in ep2 dp2ep2_zero1 dp2ep2_zero2_accum ep2_fsdp; do
  $check losses "$out/rb_one.h5" "$out/rb_$r.h5"
done
$check losses "$out/rb_one_sgd.h5" "$out/rb_ep2_sgd.h5"
$check losses "$out/rb_one_mixed.h5" "$out/rb_ep2_mixed.h5"
for r in ep2 dp2ep2_zero1 ep2_fsdp; do
  $check weights "$out/rb_one_weights.h5" "$out/rb_${r}_weights.h5" "$out/rb_$r.h5"
done
grep -q "ep rebalance after step 2: busiest ep rank" "$out/rb_ep2.log" || { cat "$out/rb_ep2.log"; echo "no rebalance line"; exit 1; }

# Relabelled, checkpointed at step 6 and resumed: the checkpoint holds the relabelled model by name.
half=(--train.steps=6 --train.checkpoint_every=6 --optim.cosine_steps=12)
run 2 ck --parallel.ep=2 $every=2 "${half[@]}" --train.checkpoint_dir="$out/rb_ck"
run 2 resumed --parallel.ep=2 $every=2 --train.steps=12 --optim.cosine_steps=12 --train.resume=auto \
  --train.checkpoint_dir="$out/rb_ck"
grep -q "resumed from" "$out/rb_resumed.log" || { echo "rb_resumed did not resume"; exit 1; }
python3 - "$out/rb_one.h5" "$out/rb_resumed.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1]) as a, h5py.File(sys.argv[2]) as b:
    ref = {int(s): float(l) for s, l in zip(a["/train/steps"]["step"], a["/train/steps"]["loss"])}
    got = {int(s): float(l) for s, l in zip(b["/train/steps"]["step"], b["/train/steps"]["loss"])}
assert min(got) == 7 and max(got) == 12, sorted(got)
worst = max(abs(ref[s] - l) for s, l in got.items())
assert worst <= 1e-6, f"resumed relabelled run: loss differs from one process by {worst:.3g}"
print(f"ep_rebalance_check.sh: the resumed relabelled run matches one process (max {worst:.3g})")
PY

# bench-model relabels in its warm-up steps only.
mpirun --oversubscribe --allow-run-as-root -np 2 "$lmscale" "$deck" $experts --run.job=bench-model --parallel.ep=2 \
  --bench.warmup=4 --bench.steps=2 --bench.batch_size=8 $every=2 --run.output="$out/rb_bench.h5" \
  > "$out/rb_bench.log" 2>&1 || { cat "$out/rb_bench.log"; exit 1; }
python3 - "$out/rb_bench.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1]) as f:
    t = f["/bench_model/ep_placement"][:]
steps = sorted(set(int(s) for s in t["step"]))
assert steps == [2, 4], f"bench-model relabelled after steps {steps}, expected the warm-up's 2 and 4"
assert (t["busiest_rank_after"] <= t["busiest_rank_before"] + 1e-12).all(), t
print(f"ep_rebalance_check.sh: bench-model relabelled after warm-up steps {steps}")
PY

# Refusals: one ep rank; bench-model whose warm-up ends before the first relabelling.
refused() {   # refused NAME NP ARGS...: exit 2, a message naming parallel.ep_rebalance_every, no output
  local name=$1 np=$2
  shift 2
  set +e
  mpirun --oversubscribe --allow-run-as-root -np "$np" "$lmscale" "$deck" --run.output="$out/rb_$name.h5" "$@" \
    > "$out/rb_$name.log" 2>&1
  local rc=$?
  set -e
  [ "$rc" -eq 2 ] || { cat "$out/rb_$name.log"; echo "rb_$name: exit $rc, expected 2"; exit 1; }
  grep -q "error: parallel.ep_rebalance_every" "$out/rb_$name.log" || { cat "$out/rb_$name.log"; echo "rb_$name: no error naming the key"; exit 1; }
  [ ! -e "$out/rb_$name.h5" ] || { echo "rb_$name: a results file was written"; exit 1; }
}
refused no_ep 2 $every=2
refused short_warmup 2 --run.job=bench-model --parallel.ep=2 --bench.warmup=2 $every=3
echo "ep_rebalance_check.sh: relabelled experts give one process's model"
