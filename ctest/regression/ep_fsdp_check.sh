#!/usr/bin/env bash
# ep_fsdp_check.sh LMSCALE DECK OUTDIR
# Expert parallelism over fsdp (docs/moe.md, docs/parallel.md "Expert parallelism") against one
# process on tiny_moe.ini (fp32, 4 experts): ep = 2 on 2 ranks (dp 2 = ep 2: one rank per
# expert_dp group, fsdp acts as one process) and dp 2 x ep 2 on 4 ranks (fsdp over expert_dp
# groups of 2: a block's unit holds its dense weights and this ep rank's 2 experts), with the
# deck's capacity drops and dropless, with grad_accum 2 (FSDP reduce-scatters every micro-batch,
# so the dense gradients are summed over ep in every micro-batch) and every-k checkpointing;
# losses and gradient norms within 1e-6 of one process and /train/moe's counts equal
# (ep_check.py). Then resume across layouts by name: sharded checkpoints written by fsdp x ep
# resumed by one process, by zero1 x ep and by ep 4 (ddp), and one process's resumed by fsdp x ep
# (fsdp writes sharded checkpoints only); the final weights by name equal one process's.
set -euo pipefail
lmscale=$1 deck=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
check="python3 $here/ep_check.py"
mkdir -p "$out"
rm -rf "$out"/epf_*
run() {   # run NP NAME ARGS...
  local np=$1 name=$2
  shift 2
  if [ "$np" -gt 1 ]; then
    mpirun --oversubscribe --allow-run-as-root -np "$np" "$lmscale" "$deck" --run.output="$out/epf_$name.h5" "$@" \
      > "$out/epf_$name.log" 2>&1 || { cat "$out/epf_$name.log"; exit 1; }
  else
    "$lmscale" "$deck" --run.output="$out/epf_$name.h5" "$@" > "$out/epf_$name.log" 2>&1 || { cat "$out/epf_$name.log"; exit 1; }
  fi
}
dropless=--model.moe_capacity_factor=0
fsdp=(--parallel.zero=fsdp --parallel.ep=2)
run 1 one --train.save="$out/epf_one_weights.h5" --train.eval_every=6
run 1 one_dropless $dropless
run 2 ep2 "${fsdp[@]}"
run 4 dp2ep2 "${fsdp[@]}" --train.save="$out/epf_dp2ep2_weights.h5" --train.eval_every=6
run 4 dp2ep2_accum "${fsdp[@]}" --train.grad_accum=2
run 4 dp2ep2_accum_everyk_dropless "${fsdp[@]}" --train.grad_accum=2 --train.activation_checkpointing=every-k $dropless
run 4 dp2ep2_dropless "${fsdp[@]}" $dropless
run 2 ep2_dropless "${fsdp[@]}" $dropless
grep -q "fsdp x ep" "$out/epf_dp2ep2.log" || { cat "$out/epf_dp2ep2.log"; echo "the layout line does not name fsdp x ep"; exit 1; }
for r in ep2 dp2ep2 dp2ep2_accum; do
  $check "$out/epf_one.h5" "$out/epf_$r.h5"
done
for r in ep2_dropless dp2ep2_dropless dp2ep2_accum_everyk_dropless; do
  $check "$out/epf_one_dropless.h5" "$out/epf_$r.h5"
done
$check --weights "$out/epf_one_weights.h5" "$out/epf_dp2ep2_weights.h5"

# Resume across layouts: the first 6 steps in one layout, the last 6 in another.
half=(--train.steps=6 --train.checkpoint_every=6 --optim.cosine_steps=12)
rest=(--train.steps=12 --optim.cosine_steps=12 --train.resume=auto)
run 4 ck_fsdp "${half[@]}" "${fsdp[@]}" --train.checkpoint_dir="$out/epf_ck_a"
cp -r "$out/epf_ck_a" "$out/epf_ck_b"
cp -r "$out/epf_ck_a" "$out/epf_ck_d"
run 1 from_fsdp "${rest[@]}" --train.checkpoint_dir="$out/epf_ck_a" --train.save="$out/epf_from_fsdp_weights.h5"
run 4 from_fsdp_to_zero1 "${rest[@]}" --parallel.ep=2 --parallel.zero=zero1 --train.checkpoint_dir="$out/epf_ck_b"
run 1 ck_one "${half[@]}" --train.checkpoint_dir="$out/epf_ck_c"
run 4 from_one_to_fsdp "${rest[@]}" "${fsdp[@]}" --train.checkpoint_dir="$out/epf_ck_c" \
  --train.save="$out/epf_from_one_to_fsdp_weights.h5"
run 4 from_fsdp_to_ep4 "${rest[@]}" --parallel.ep=4 --train.checkpoint_dir="$out/epf_ck_d" \
  --train.save="$out/epf_from_fsdp_to_ep4_weights.h5"
for r in ck_fsdp from_fsdp from_fsdp_to_zero1 ck_one from_one_to_fsdp from_fsdp_to_ep4; do
  $check "$out/epf_one.h5" "$out/epf_$r.h5"
done
for r in from_fsdp from_fsdp_to_zero1 from_one_to_fsdp from_fsdp_to_ep4; do
  grep -q "resumed from" "$out/epf_$r.log" || { echo "epf_$r did not resume"; exit 1; }
done
for r in from_fsdp from_one_to_fsdp from_fsdp_to_ep4; do
  $check --weights "$out/epf_one_weights.h5" "$out/epf_${r}_weights.h5"
done
echo "ep_fsdp_check.sh: expert parallelism over fsdp matches one process"
