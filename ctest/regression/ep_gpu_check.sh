#!/usr/bin/env bash
# ep_gpu_check.sh LMSCALE DECK OUTDIR
# Expert parallelism on 2 GPUs (docs/moe.md): tiny_moe.ini in bf16 on CUDA, one process on one GPU
# against ep = 2 over 2 GPUs (NCCL all-to-all of the rows), with the deck's capacity drops and
# dropless, and against fsdp over 2 GPUs (ep = 1; not yet run on GPUs when written). bf16 rounds differently when the experts' GEMMs see other row counts and the dense
# gradients are summed over 2 ranks, so: losses and gradient norms within 3e-2 of one process, the
# tokens per MoE row equal, the assignments per expert within 3% (ep_check.py's COUNT_TOL). ep = 2
# with parallel.ep_exchange = copy-engine (the rows over the GPUs' copy engines) against ep = 2 over
# NCCL: copies, so the same bits (tolerance 0: losses, gradient norms, evaluations, /train/moe),
# also with 2 micro-batches and an evaluation of the whole local batch (chunks through the window).
# ep = 2 over the copy engines with the experts relabelled every 2 steps (parallel.ep_rebalance_every)
# against one GPU, with the same tolerances (ep_rebalance_check.py: the counts relabelled).
# Exit 77 (skipped) with fewer than 2 GPUs.
set -euo pipefail
lmscale=$1 deck=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 2 ]; then
  echo "ep_gpu_check.sh: fewer than 2 GPUs ($gpus): skipping"
  exit 77
fi
mkdir -p "$out"
rm -rf "$out"/epgpu_*
gpu=(--parallel.device=cuda --precision.mode=bf16)
run() {   # run NP NAME ARGS...
  local np=$1 name=$2
  shift 2
  if [ "$np" -gt 1 ]; then
    mpirun --oversubscribe --allow-run-as-root -np "$np" "$lmscale" "$deck" "${gpu[@]}" \
      --run.output="$out/epgpu_$name.h5" "$@" > "$out/epgpu_$name.log" 2>&1 || { cat "$out/epgpu_$name.log"; exit 1; }
  else
    "$lmscale" "$deck" "${gpu[@]}" --run.output="$out/epgpu_$name.h5" "$@" > "$out/epgpu_$name.log" 2>&1 ||
      { cat "$out/epgpu_$name.log"; exit 1; }
  fi
}
dropless=--model.moe_capacity_factor=0
run 1 one
run 2 ep2 --parallel.ep=2
run 1 one_dropless $dropless
run 2 ep2_dropless --parallel.ep=2 $dropless
run 2 fsdp --parallel.zero=fsdp   # fsdp of the MoE model (ep = 1) over NCCL
ce=--parallel.ep_exchange=copy-engine
accum=(--train.grad_accum=2 --train.eval_every=6 --train.eval_batches=2)
run 2 ep2_ce --parallel.ep=2 $ce
run 2 ep2_accum --parallel.ep=2 "${accum[@]}"
run 2 ep2_ce_accum --parallel.ep=2 $ce "${accum[@]}"
run 2 ep2_ce_rebalance --parallel.ep=2 $ce --parallel.ep_rebalance_every=2
python3 "$here/ep_check.py" "$out/epgpu_one.h5" "$out/epgpu_ep2.h5" 3e-2 0.03
python3 "$here/ep_check.py" "$out/epgpu_one_dropless.h5" "$out/epgpu_ep2_dropless.h5" 3e-2 0.03
python3 "$here/ep_check.py" "$out/epgpu_one.h5" "$out/epgpu_fsdp.h5" 3e-2 0.03
python3 "$here/ep_check.py" "$out/epgpu_ep2.h5" "$out/epgpu_ep2_ce.h5" 0
python3 "$here/ep_check.py" "$out/epgpu_ep2_accum.h5" "$out/epgpu_ep2_ce_accum.h5" 0
python3 "$here/ep_rebalance_check.py" losses "$out/epgpu_one.h5" "$out/epgpu_ep2_ce_rebalance.h5" 3e-2 0.03
echo "ep_gpu_check.sh: ep = 2 (relabelled too) and fsdp on 2 GPUs match one GPU; ep = 2 over the copy engines is ep = 2 over NCCL, bitwise"
