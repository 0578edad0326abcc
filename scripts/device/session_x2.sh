#!/usr/bin/env bash
# One nvidia-h200-x2 call for the runs that need two GPUs, in priority order (each stage has its
# own timeout and writes its summary line at once, so a call cut short keeps what finished).
# Carry [".deps", ".device"].   scripts/device/session_x2.sh [stages...]
#   build   lmscale, check_table, mpi_test_nccl_comm
#   8b      issue 14: inputs/leaderboard_8b.ini (fsdp, full checkpointing, Hopper attention), 3 timed
#           steps; wall time from launch to exit beside the step time
#   peer    the torch FSDP2 peer of the 8B step
#   fail    issue 15 item 4: scripts/device/rank_failure.sh kill hang (rank 1 killed inside a
#           bucketed all-reduce; rank 1 hangs with parallel.timeout_s = 10)
#   small   issue 14: the 8B deck scaled down (2 layers, context 2048, real widths): 1 GPU vs fsdp
#   memory  issue 21: zero2 on 2 GPUs, predicted vs measured peak (small, xl, 2.7B at 512, bf16)
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build 8b peer fail small memory}
OUT=${OUT:-/tmp/x2_out}
source scripts/device/session_lib.sh
DECK=inputs/leaderboard_8b.ini
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$summary"
build_stage lmscale check_table mpi_test_nccl_comm
if has 8b; then
  t=$(date +%s)
  timeout 240 "${MPIRUN[@]}" -np 2 $LM $DECK --bench.steps=3 --run.output="$OUT/8b.h5" > "$OUT/8b.log" 2>&1
  note "8b fsdp (rc $?, launch to exit $(( $(date +%s) - t )) s): $(brief "$OUT/8b.log")"
  grep -aE "^(forward|backward|optimizer|communication|exposed|step|MFU|tokens)" "$OUT/8b.log" | head -12 >> "$summary"
fi
if has peer; then
  timeout 200 torchrun --nproc-per-node 2 $PEER fsdp --size 8b --precision bf16 --batch 2 --seq 32768 --attention sdpa \
    --ac --warmup 1 --iters 2 > "$OUT/peer.log" 2>&1
  note "peer 8b (rc $?): $(tail -1 "$OUT/peer.log")"
fi
if has fail; then
  OUT=$OUT/fail timeout 150 scripts/device/rank_failure.sh kill hang > "$OUT/rank_failure.log" 2>&1
  note "rank failure (rc $?): $(grep -aE '^(PASS|FAIL)|rank_failure:' "$OUT/rank_failure.log" | tr '\n' ' ')"
fi
if has small; then
  SMALL=(--run.job=train --model.num_layers=2 --model.context_length=2048 --train.batch_size=2 --train.steps=3
         --train.log_every=1 --train.eval_every=0 --data.source=synthetic --train.activation_checkpointing=selective --train.checkpoint_keep_attention=false
         --parallel.dp=0)
  CUDA_VISIBLE_DEVICES=0 timeout 90 $LM $DECK "${SMALL[@]}" --parallel.zero=none --run.output="$OUT/small_1gpu.h5" \
    > "$OUT/small_1gpu.log" 2>&1
  timeout 90 "${MPIRUN[@]}" -np 2 $LM $DECK "${SMALL[@]}" --run.output="$OUT/small_fsdp.h5" > "$OUT/small_fsdp.log" 2>&1
  paste <(grep -E '^step ' "$OUT/small_1gpu.log" | awk '{print $4}') <(grep -E '^step ' "$OUT/small_fsdp.log" | awk '{print $4}') |
    awk -v lnv="$(python3 -c 'import math; print(math.log(151936))')" '
      { d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d; if (NR == 1) first = $1; n++; l = l " " $1 "/" $2 }
      END { ok = (n == 3 && w < 2e-2 && (first - lnv < 0.1 && lnv - first < 0.1));
            printf "small 8b (1 GPU / fsdp 2 GPUs):%s; max rel diff %.2e, first loss vs ln V %.4f: %s\n",
                   l, w, lnv, ok ? "PASS" : "FAIL" }' | tee -a "$summary"
fi
if has memory; then
  for size in small xl 2.7B; do
    log=$OUT/mem_zero2_$size.log
    timeout 90 "${MPIRUN[@]}" -np 2 $LM inputs/bench_model_xl_bf16.ini --model.size=$size --parallel.zero=zero2 \
      --parallel.dp=2 --bench.batch_size=8 --bench.warmup=1 --bench.steps=2 --model.attention=flash \
      --run.output="$OUT/mem_zero2_$size.h5" > "$log" 2>&1
    note "memory zero2 2 GPUs $size 512 bf16 train-step (rc $?): $(grep -oE 'peak memory [0-9.]+ GiB' "$log" | tail -1), $(grep -oE 'predicted peak \(accounting\) [0-9.]+ GiB' "$log" | tail -1)"
  done
fi
note "done at $(( $(date +%s) - T0 )) s"
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude='*.h5' $(find . -name '*.log' -o -name 'summary.txt') 2>/dev/null)
echo "==== summary"; cat "$summary"
