#!/usr/bin/env bash
# Study: collective bus bandwidth on NGPU GPUs (default 2) with NCCL: lmscale's bench-collectives
# (inputs/collectives_nccl.ini: all-reduce, reduce-scatter, all-gather, broadcast; fp32 and bf16;
# 1 MiB .. 1000 MiB by x10) against torch.distributed with the same sizes.
#   NGPU=8 bench/study_collectives.sh      DTYPES="fp32 bf16" adds the bf16 rows
STUDY=collectives
source "$(dirname "$0")/common.sh"
NGPU=${NGPU:-2}
DTYPES=${DTYPES:-fp32}
preflight "$NGPU"
OPS="all-reduce reduce-scatter all-gather broadcast"

runs() {
  lm nccl "$NGPU" inputs/collectives_nccl.ini
  peer nccl "$NGPU" collectives --backend nccl --ops "${OPS// /,}" --dtypes fp32,bf16 --min-bytes 1M \
    --max-bytes 1G --step-factor 10 --warmup 5 --iters 20
}
repeat runs

for dtype in $DTYPES; do
  for op in $OPS; do
    for mib in 1 10 100 1000; do
      bytes=$((mib * 1048576))
      row "$op $dtype $mib MiB" GB/s nccl /bench_collectives/results:busbw_gbs nccl busbw_gbs \
        "op=$op,dtype=$dtype,bytes=$bytes,inplace=0" "op=$op,dtype=$dtype,bytes=$bytes"
    done
  done
done
print_table "NCCL collectives on $NGPU GPUs, bus bandwidth"
