#!/usr/bin/env bash
# Study: tensor parallelism of the 2.7B model (2560/10240/32/32), bf16, flash attention, global
# batch 4 x 512, full train steps: lmscale on 1 GPU and with tp = 2 (without and with sequence
# parallelism; inputs/tp_2.7B_*.ini) against the peer on 1 GPU (SDPA) and DTensor Megatron TP on 2.
#   bench/study_tp.sh
STUDY=tp
source "$(dirname "$0")/common.sh"
preflight 2
P=(--size 2.7B --precision bf16 --batch 4 --seq 512 --attention sdpa --warmup 3 --iters 8)

runs() {
  lm tp_1gpu 1 inputs/tp_2.7B_1gpu.ini
  peer model_1gpu 1 model "${P[@]}"
  lm tp_2 2 inputs/tp_2.7B_tp2.ini
  lm tp_2_sp 2 inputs/tp_2.7B_tp2_sp.ini
  peer tp_2 2 tp "${P[@]}"
}
repeat runs

step_rows "1 GPU" tp_1gpu model_1gpu
step_rows "tp = 2" tp_2 tp_2
step_rows "tp = 2 + sequence parallel vs tp = 2" tp_2_sp tp_2
print_table "2.7B tensor parallel, bf16, batch 4 x 512, train step"
