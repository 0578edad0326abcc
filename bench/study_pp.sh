#!/usr/bin/env bash
# Study: pipeline parallelism of the xl model, bf16, flash attention, global batch 8 x 512: 2
# stages of 24 blocks with 1F1B and GPipe over 8 microbatches of one sequence
# (inputs/pp_xl_{1f1b,gpipe}.ini), ZB-H1 over 2 microbatches of 4 (inputs/pp_xl_zbh1.ini; the peer
# runs its 1F1B on the same 2 microbatches: torch.distributed.pipelining's zero-bubble schedules
# need several stages per rank) and the 1-GPU step at batch 8 (inputs/pp_xl_1gpu.ini), against
# torch.distributed.pipelining and the peer on one GPU. The peer's pipeline keeps bf16 weights (no
# fp32 master copy; see torch_peer.py pp).
#   bench/study_pp.sh
STUDY=pp
source "$(dirname "$0")/common.sh"
preflight 2
P=(--size xl --precision bf16 --batch 8 --attention sdpa --warmup 3 --iters 8)

runs() {
  lm pp_1gpu 1 inputs/pp_xl_1gpu.ini
  peer pp_1gpu 1 model "${P[@]}"
  lm pp_1f1b 2 inputs/pp_xl_1f1b.ini
  peer pp_1f1b 2 pp "${P[@]}" --microbatches 8 --schedule 1f1b
  lm pp_gpipe 2 inputs/pp_xl_gpipe.ini
  peer pp_gpipe 2 pp "${P[@]}" --microbatches 8 --schedule gpipe
  lm pp_zbh1_m2 2 inputs/pp_xl_zbh1.ini
  peer pp_zbh1_m2 2 pp "${P[@]}" --microbatches 2 --schedule 1f1b
}
repeat runs

step_rows "1 GPU, batch 8" pp_1gpu pp_1gpu
step_rows "pp = 2, 1F1B" pp_1f1b pp_1f1b
step_rows "pp = 2, GPipe" pp_gpipe pp_gpipe
step_rows "pp = 2, ZB-H1, 2 microbatches of 4 (peer: 1F1B)" pp_zbh1_m2 pp_zbh1_m2
print_table "xl pipeline parallel, bf16, batch 8 x 512 (8 microbatches unless named), train step"
