#!/usr/bin/env bash
# Study: the mixture-of-experts model moe-1b (docs/moe.md: d_model 1024, 12 blocks, 16 heads, 8
# experts of 2816, top-2, vocab 10000), bf16, flash attention, 8 sequences of 1024 tokens per GPU,
# full train steps:
#   - one GPU (inputs/moe_1b_gpu.ini) against the dense model of equal active FLOPs
#     (inputs/moe_1b_dense_gpu.ini, d_ff 5632) and the peer's two formulations (bench/torch_peer.py
#     moe: a Python loop of per-expert GEMMs, and torch._grouped_mm with --grouped);
#   - expert parallelism on 2 GPUs (ep = 2, 4 experts per GPU, global batch 16) against the same
#     peers on 2 ranks (all_to_all_single dispatch), its rows over NCCL (the default) and over the
#     GPUs' copy engines (parallel.ep_exchange = copy-engine, docs/moe.md).
# Tokens/s are global (all GPUs).
#   bench/study_moe.sh
STUDY=moe
source "$(dirname "$0")/common.sh"
preflight 2
# The peers warm up as long as lmscale's decks (300 steps), at lmscale's peak learning rate
# (optim.lr 1e-3, which lmscale decays by a cosine and the peer holds): the routers' balance
# losses even out the experts' load over the first few hundred steps (docs/moe.md, "The
# benchmark's steady state"), and cuBLAS too meets new expert row counts every step, whose first
# ones cost heuristic queries and kernel loads.
P=(--batch 8 --seq 1024 --precision bf16 --attention sdpa --warmup 300 --iters 8 --lr 1e-3)

runs() {
  lm moe_1gpu 1 inputs/moe_1b_gpu.ini
  lm dense_1gpu 1 inputs/moe_1b_dense_gpu.ini
  peer moe_eager_1gpu 1 moe "${P[@]}"
  peer moe_grouped_1gpu 1 moe "${P[@]}" --grouped
  lm moe_ep2 2 inputs/moe_1b_gpu.ini --parallel.ep=2 --bench.batch_size=16
  lm moe_ep2_ce 2 inputs/moe_1b_gpu.ini --parallel.ep=2 --bench.batch_size=16 --parallel.ep_exchange=copy-engine
  peer moe_eager_ep2 2 moe "${P[@]}"
  peer moe_grouped_ep2 2 moe "${P[@]}" --grouped
}
repeat runs

tok_rows() {
  row "$1: tokens/s" tokens/s "$2" /bench_model@tokens_per_s "$3" tokens_per_s
  row "$1: peak memory" GiB "$2" /bench_model@peak_bytes "$3" peak_gib
}
tok_rows "1 GPU (peer: eager loop)" moe_1gpu moe_eager_1gpu
tok_rows "1 GPU (peer: grouped_mm)" moe_1gpu moe_grouped_1gpu
tok_rows "ep = 2 (peer: eager loop)" moe_ep2 moe_eager_ep2
tok_rows "ep = 2 (peer: grouped_mm)" moe_ep2 moe_grouped_ep2
tok_rows "ep = 2, rows over the copy engines (peer: grouped_mm)" moe_ep2_ce moe_grouped_ep2
print_table "moe-1b, bf16, 8 x 1024 tokens per GPU, train step"
# lmscale's own ratios (bench-model's tokens_per_s, from the mean timed step): MoE against the
# dense model of equal active FLOPs, ep = 2 against one GPU,
# each ep = 2 ratio with its runs' routing balance (the busiest ep rank's rows over the mean
# rank's, which the ep = 2 step follows: docs/moe.md, "The benchmark's steady state").
if [ -z "$DRY_RUN" ]; then
  "$PYTHON" - "$OUT" <<'PY'
import glob, statistics, sys
import h5py
out = sys.argv[1]
def attr(case, name):
    v = []
    for f in sorted(glob.glob(f"{out}/{case}/lmscale_*.h5")):
        a = h5py.File(f, "r")["bench_model"].attrs
        if name in a:
            v.append(float(a[name]))
    return statistics.median(v) if v else float("nan")
tps = lambda case: attr(case, "tokens_per_s")
balance = lambda case: attr(case, "moe_ep_rank_rows_max_over_mean")
moe, dense, ep2, ep2_ce = tps("moe_1gpu"), tps("dense_1gpu"), tps("moe_ep2"), tps("moe_ep2_ce")
print(f"moe / dense (1 GPU, equal active FLOPs): {moe:.0f} / {dense:.0f} tokens/s = {moe / dense:.3f}")
print(f"ep = 2 / one GPU: {ep2:.0f} / {moe:.0f} tokens/s = {ep2 / moe:.3f}"
      f" (busiest ep rank {balance('moe_ep2'):.2f}x the mean)")
print(f"ep = 2 over the copy engines / one GPU: {ep2_ce:.0f} / {moe:.0f} tokens/s = {ep2_ce / moe:.3f}"
      f" (busiest ep rank {balance('moe_ep2_ce'):.2f}x the mean; over NCCL: {ep2 / moe:.3f})")
PY
fi
