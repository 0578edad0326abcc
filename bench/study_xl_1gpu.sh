#!/usr/bin/env bash
# Study: the xl model (1600/6400/48/25, about 2.0B parameters) on one GPU, batch 4 x 512, full
# AdamW train steps (inputs/bench_model_xl_{fp32,bf16}.ini) against the peer's eager model in the
# same precision and attention, and lmscale's flash attention against SDPA, eager and torch.compile;
# lmscale also with the step captured as a CUDA graph (train.cuda_graphs) against torch.compile.
#   bench/study_xl_1gpu.sh        (REPEATS=3; bench/common.sh lists the environment)
STUDY=xl_1gpu
source "$(dirname "$0")/common.sh"
preflight 1
T=(--warmup 5 --iters 10)   # the decks' bench.warmup and bench.steps

runs() {
  lm xl_fp32 1 inputs/bench_model_xl_fp32.ini
  peer xl_fp32 1 model --size xl --precision fp32 "${T[@]}"
  lm xl_bf16 1 inputs/bench_model_xl_bf16.ini
  peer xl_bf16 1 model --size xl --precision bf16 "${T[@]}"
  lm xl_bf16_flash 1 inputs/bench_model_xl_bf16.ini --model.attention=flash
  lm xl_bf16_flash_graphs 1 inputs/bench_model_xl_bf16.ini --model.attention=flash --train.cuda_graphs=true
  peer xl_bf16_sdpa 1 model --size xl --precision bf16 --attention sdpa "${T[@]}"
  peer xl_bf16_compile 1 model --size xl --precision bf16 --attention sdpa --compile "${T[@]}"
}
repeat runs

step_rows "fp32, naive attention" xl_fp32 xl_fp32
step_rows "bf16, naive attention" xl_bf16 xl_bf16
step_rows "bf16, flash vs SDPA eager" xl_bf16_flash xl_bf16_sdpa
step_rows "bf16, flash vs SDPA + torch.compile" xl_bf16_flash xl_bf16_compile
step_rows "bf16, flash + CUDA graphs vs SDPA + torch.compile" xl_bf16_flash_graphs xl_bf16_compile
print_table "xl on 1 GPU, batch 4 x 512, train step"
