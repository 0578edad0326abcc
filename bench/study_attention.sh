#!/usr/bin/env bash
# Study: one causal attention call at the leaderboard shape (batch 1, 16 heads, seq 16384,
# head_dim 64, bf16; inputs/attention_leaderboard.ini): lmscale's flash kernel against
# F.scaled_dot_product_attention and lmscale's naive kernel against the peer's naive attention,
# forward, backward and forward+backward (median of 20 after 5 warm-up on both sides).
#   bench/study_attention.sh
STUDY=attention
source "$(dirname "$0")/common.sh"
preflight 1

runs() {
  lm attention 1 inputs/attention_leaderboard.ini --bench.impls=flash,naive
  peer attention 1 attention --batch 1 --heads 16 --seq 16384 --head-dim 64 --dtype bf16 --causal \
    --impl sdpa,naive --warmup 5 --iters 20
}
repeat runs

for pass in forward backward forward-backward; do
  row "flash vs SDPA: $pass" ms attention /bench_attention/results:time_ms attention time_ms \
    "impl=flash,pass=$pass" "impl=sdpa,pass=$pass"
done
for pass in forward backward forward-backward; do
  row "naive vs naive: $pass" ms attention /bench_attention/results:time_ms attention time_ms \
    "impl=naive,pass=$pass" "impl=naive,pass=$pass"
done
print_table "attention, B 1, H 16, T 16384, D 64, bf16, causal"
