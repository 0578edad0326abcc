#!/usr/bin/env bash
# Study: data parallelism of the xl model on 2 GPUs, bf16, 4 sequences of 512 per rank (global 8),
# full AdamW train steps: every lmscale variant (inputs/ddp_xl_*.ini: naive, flat, overlap,
# bucketed 1/10/100/1000 MB, ZeRO-1-broadcast, ZeRO-1, ZeRO-2) against torch DDP (bucket 25 MB).
#   bench/study_data_parallel.sh
#   DDP_DECKS="ddp_xl_zero2 ddp_xl_bucketed_copy_engine" bench/study_data_parallel.sh   # a choice
# The copy-engine decks need CUDA IPC between the GPUs; add them by DDP_DECKS.
STUDY=data_parallel
source "$(dirname "$0")/common.sh"
preflight 2
DDP_DECKS=${DDP_DECKS:-ddp_xl_naive ddp_xl_flat ddp_xl_overlap ddp_xl_bucketed_1mb ddp_xl_bucketed_10mb \
ddp_xl_bucketed_100mb ddp_xl_bucketed_1000mb ddp_xl_zero1_broadcast ddp_xl_zero1 ddp_xl_zero2}

runs() {
  for deck in $DDP_DECKS; do lm "$deck" 2 "inputs/$deck.ini"; done
  peer ddp 2 ddp --size xl --precision bf16 --batch 4 --warmup 3 --iters 8   # --batch: per rank
}
repeat runs

for deck in $DDP_DECKS; do step_rows "${deck#ddp_xl_} vs torch DDP" "$deck" ddp; done
print_table "xl data parallel on 2 GPUs, bf16, global batch 8 x 512, train step"
