#!/usr/bin/env bash
# Study: the CS336 leaderboard step, the 8b model (4096/11008/34/32, vocab 151936) at 2 x 32768
# tokens on 2 GPUs, bf16, FSDP, flash attention (inputs/leaderboard_8b.ini) against FSDP2 with full
# activation checkpointing and SDPA. Both need about 110 GiB per GPU: run it on H200s (141 GB);
# on 80 GB GPUs both sides run out of memory and the rows show "-".
#   bench/study_leaderboard_8b.sh          (PEER_ITERS=5: timed peer steps, as the deck's 5)
STUDY=leaderboard_8b
source "$(dirname "$0")/common.sh"
preflight 2
PEER_ITERS=${PEER_ITERS:-5}

runs() {
  lm leaderboard_8b 2 inputs/leaderboard_8b.ini
  peer fsdp_8b 2 fsdp --size 8b --precision bf16 --batch 2 --seq 32768 --attention sdpa --ac \
    --warmup 1 --iters "$PEER_ITERS"
}
repeat runs

step_rows "8b, 2 x 32768 tokens, FSDP" leaderboard_8b fsdp_8b
row "8b: tokens/s" tokens/s leaderboard_8b /bench_model@tokens_per_s fsdp_8b tokens_per_s
print_table "8b leaderboard step on 2 GPUs"
