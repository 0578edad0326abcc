#!/usr/bin/env bash
# Study: optimizer offload to host memory (parallel.offload = optimizer and optimizer+params,
# docs/parallel.md) on 2 GPUs against FSDP2 with CPUOffloadPolicy (bench/torch_peer.py fsdp --offload: sharded
# parameters, gradients and AdamW state in pinned host memory, AdamW on the CPU):
#   - the 8b leaderboard step (inputs/leaderboard_8b_offload.ini) beside the in-memory deck
#     (inputs/leaderboard_8b.ini, which needs ~108 GiB per GPU: its row shows "-" on 80 GB cards);
#   - xl FSDP at global batch 8 x 512 (inputs/fsdp_xl.ini) with and without offload.
# Needs ~100 GB of host memory for the 8b rows.
#   bench/study_offload.sh        (SKIP_8B=1: only the xl rows; SKIP_XL=1: only the 8b rows; SKIP_8B_PEER=1: no 8b peer)
STUDY=offload
source "$(dirname "$0")/common.sh"
preflight 2
PEER_ITERS=${PEER_ITERS:-2}

runs() {
  if [ -z "${SKIP_XL:-}" ]; then
    lm fsdp_xl 2 inputs/fsdp_xl.ini
    lm fsdp_xl_offload 2 inputs/fsdp_xl.ini --parallel.offload=optimizer
    lm fsdp_xl_offload_params 2 inputs/fsdp_xl.ini --parallel.offload=optimizer+params
    peer fsdp_xl_peer_offload 2 fsdp --size xl --precision bf16 --batch 8 --attention sdpa --warmup 2 --iters 4 --offload
  fi
  if [ -z "${SKIP_8B:-}" ]; then
    lm leaderboard_8b 2 inputs/leaderboard_8b.ini
    lm leaderboard_8b_offload 2 inputs/leaderboard_8b_offload.ini
    lm leaderboard_8b_offload_params 2 inputs/leaderboard_8b_offload.ini --parallel.offload=optimizer+params
    [ -n "${SKIP_8B_PEER:-}" ] || peer fsdp_8b_peer_offload 2 fsdp --size 8b --precision bf16 --batch 2 --seq 32768 --attention sdpa --ac --offload \
      --warmup 1 --iters "$PEER_ITERS"
  fi
}
repeat runs

if [ -z "${SKIP_XL:-}" ]; then
  step_rows "xl fsdp, offload (peer: FSDP2 + CPUOffloadPolicy)" fsdp_xl_offload fsdp_xl_peer_offload
  step_rows "xl fsdp, offload optimizer+params (same peer)" fsdp_xl_offload_params fsdp_xl_peer_offload
  step_rows "xl fsdp, no offload (same peer)" fsdp_xl fsdp_xl_peer_offload
fi
if [ -z "${SKIP_8B:-}" ]; then
  step_rows "8b, 2 x 32768, offload (peer: FSDP2 + CPUOffloadPolicy)" leaderboard_8b_offload fsdp_8b_peer_offload
  step_rows "8b, 2 x 32768, offload optimizer+params (same peer)" leaderboard_8b_offload_params fsdp_8b_peer_offload
  step_rows "8b, 2 x 32768, no offload (same peer)" leaderboard_8b fsdp_8b_peer_offload
fi
print_table "optimizer offload on 2 GPUs, bf16, train step"
