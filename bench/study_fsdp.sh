#!/usr/bin/env bash
# Study: fully sharded data parallelism (ZeRO-3) of the xl model on 2 GPUs, bf16, flash attention,
# global batch 8 x 512 (inputs/fsdp_xl*.ini) against FSDP2 (fully_shard per block, bf16 params,
# fp32 reduction, SDPA): no activation checkpointing, then full recompute (the peer's --ac) beside
# lmscale's full and selective checkpointing.
#   bench/study_fsdp.sh
STUDY=fsdp
source "$(dirname "$0")/common.sh"
preflight 2
P=(--size xl --precision bf16 --batch 8 --attention sdpa --warmup 3 --iters 8)   # --batch: global

runs() {
  lm fsdp_xl 2 inputs/fsdp_xl.ini
  peer fsdp 2 fsdp "${P[@]}"
  lm fsdp_xl_full_ac 2 inputs/fsdp_xl_full_ac.ini
  lm fsdp_xl_selective_ac 2 inputs/fsdp_xl_selective_ac.ini
  peer fsdp_ac 2 fsdp "${P[@]}" --ac
}
repeat runs

step_rows "no checkpointing" fsdp_xl fsdp
step_rows "full checkpointing vs --ac" fsdp_xl_full_ac fsdp_ac
step_rows "selective checkpointing vs --ac" fsdp_xl_selective_ac fsdp_ac
print_table "xl FSDP on 2 GPUs, bf16, global batch 8 x 512, train step"
