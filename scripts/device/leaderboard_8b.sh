#!/usr/bin/env bash
# Issue 14 on 2 GPUs (kind nvidia-h200-x2): the 8B leaderboard step, inputs/leaderboard_8b.ini.
# Carry [".deps", ".device"].   scripts/device/leaderboard_8b.sh [stages...]
#   build     build everything on the device
#   tests     the fused LM head and RoPE-at-32767 GPU tests, the model test (chunked head vs CPU),
#             the vocabulary-parallel kernels and the 2-GPU parallel test
#   small     the deck scaled down with the real widths (2 layers, context 2048, d 4096, F 11008,
#             32 heads, vocab 151936, bf16, the deck's checkpointing): 3 train steps on 1 GPU and
#             on 2 GPUs with fsdp, the same global batch; losses compared (bf16: within 2e-2
#             relative) and the first loss against ln(151936) = 11.93 (within 0.1)
#   account   the accounting job's prediction of the deck (per-rank peak, step FLOPs)
#   run       the deck itself and its variants (RUNS, default "deck ck0 nokeep"): deck (fsdp, the
#             first 27 of 34 blocks checkpointed keeping their attention output, the last 7 keep
#             everything), ck0 (every block checkpointed), nokeep (the deck before 2026-11-25: every
#             block, the recompute runs the attention too), ck27 (= the deck since 2026-11-25),
#             zero2, selective_mlp, chunk1g (1 GiB
#             logits chunks), cs16 and ck27cs16 (NCCL on 16 CTAs, the overlapped GEMMs planned
#             for the other SMs: parallel.comm_sms), tune and ck27tune (cuBLASLt autotuning of every
#             GEMM shape on first use). LB_ARGS: more deck overrides for every run (e.g.
#             --bench.steps=3)
#   proxy     one GPU, the deck's widths at 32k tokens with 8 layers and one sequence (no sharding):
#             full checkpointing against checkpoint_keep_attention, the per-layer difference and
#             both peaks against the prediction (fits an H100; for when 2 H200s are not lent)
#   peer      torch FSDP2 peer in the same call
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests small account run peer}
OUT=${OUT:-/tmp/leaderboard_8b_out}
source scripts/device/session_lib.sh
DECK=inputs/leaderboard_8b.ini

nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$summary"
if has build; then
  scripts/device/build.sh > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
  note "build done at $(( $(date +%s) - T0 )) s"
fi
if has tests; then
  for t in test_fused_head_cuda test_model_cuda test_ops_cuda_math test_vocab_parallel_cuda; do
    timeout 300 "$BUILD/ctest/$t" --gtest_brief=1 > "$OUT/$t.log" 2>&1
    note "$t: rc=$? $(grep -aE '^\[  (PASSED|FAILED)|Failure|relative error' "$OUT/$t.log" | head -8 | tr '\n' ' ')"
  done
  timeout 300 "${MPIRUN[@]}" -np 2 "$BUILD/ctest/parallel/mpi_test_parallel_gpu" > "$OUT/test_parallel_gpu.log" 2>&1
  note "parallel gpu test (2 GPUs): rc=$? $(grep -aE 'PASSED|FAILED' "$OUT/test_parallel_gpu.log" | head -6 | tr '\n' ' ')"
fi
if has small; then
  SMALL=(--run.job=train --model.num_layers=2 --model.context_length=2048 --train.batch_size=2 --train.steps=3
         --train.log_every=1 --train.eval_every=0 --data.source=synthetic --train.activation_checkpointing=every-k --train.checkpoint_layers=0
         --parallel.dp=0)
  CUDA_VISIBLE_DEVICES=0 timeout 300 $LM $DECK "${SMALL[@]}" --parallel.zero=none --run.output="$OUT/small_1gpu.h5" \
    > "$OUT/small_1gpu.log" 2>&1
  note "small 1 GPU: rc=$? $(grep -E '^step ' "$OUT/small_1gpu.log" | awk '{print $4}' | tr '\n' ' ')"
  timeout 300 "${MPIRUN[@]}" -np 2 $LM $DECK "${SMALL[@]}" --run.output="$OUT/small_fsdp.h5" > "$OUT/small_fsdp.log" 2>&1
  note "small fsdp 2 GPUs: rc=$? $(grep -E '^step ' "$OUT/small_fsdp.log" | awk '{print $4}' | tr '\n' ' ')"
  paste <(grep -E '^step ' "$OUT/small_1gpu.log" | awk '{print $4}') <(grep -E '^step ' "$OUT/small_fsdp.log" | awk '{print $4}') |
    awk -v lnv="$(python3 -c 'import math; print(math.log(151936))')" '
      { d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d; if (NR == 1) first = $1; n++ }
      END { ok = (n == 3 && w < 2e-2 && (first - lnv < 0.1 && lnv - first < 0.1));
            printf "small: %d steps, max rel loss diff 1 GPU vs fsdp %.2e, first loss %.4f (ln V %.4f): %s\n",
                   n, w, first, lnv, ok ? "PASS" : "FAIL" }' | tee -a "$summary"
fi
if has account; then
  $LM $DECK --run.job=accounting --parallel.dp=2 --parallel.device=cpu --parallel.backend=mpi --run.output="$OUT/accounting.h5" \
    > "$OUT/accounting.log" 2>&1
  note "accounting: $(grep -E '^(peak|FLOPs)' "$OUT/accounting.log" | tr '\n' ' ')"
fi
if has proxy; then
  PROXY=(--model.num_layers=8 --parallel.zero=none --bench.batch_size=1 --train.batch_size=1 --bench.steps=3)
  for v in "full:" "keepattn:--train.checkpoint_keep_attention=true"; do
    name=${v%%:*}; args=${v#*:}
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=0 timeout 300 $LM $DECK "${PROXY[@]}" $args --run.output="$OUT/proxy_$name.h5" \
      > "$OUT/proxy_$name.log" 2>&1
    note "proxy 8 layers $name: rc=$? $(brief "$OUT/proxy_$name.log")"
  done
  # Same model, same data: the step losses agree (the first bitwise: the updates before the later
  # ones use the flash backward's atomic dQ sums).
  python3 - "$OUT/proxy_full.h5" "$OUT/proxy_keepattn.h5" <<'PY' | tee -a "$summary"
import sys, h5py
a, b = (h5py.File(f, "r")["/bench_model/steps"]["loss"][:] for f in sys.argv[1:])
print("proxy losses full", list(map(float, a)), "keepattn", list(map(float, b)), "first equal:", a[0] == b[0])
PY
fi
declare -A VARIANT=([deck]="" [nokeep]="--train.checkpoint_layers=0 --train.checkpoint_keep_attention=false"
                    [ck0]="--train.checkpoint_layers=0" [ck27]="--train.checkpoint_layers=27"
                    [zero2]="--parallel.zero=zero2"
                    [selective_mlp]="--train.activation_checkpointing=selective-mlp --train.checkpoint_keep_attention=false"
                    [chunk1g]="--model.ce_chunk_rows=3534"
                    [cs16]="--parallel.comm_sms=16" [ck27cs16]="--train.checkpoint_layers=27 --parallel.comm_sms=16"
                    [tune]="--precision.gemm_autotune=true"
                    [ck27tune]="--train.checkpoint_layers=27 --precision.gemm_autotune=true")
if has run; then
  for name in ${RUNS:-deck ck0 nokeep}; do
    args=${VARIANT[$name]}
    # shellcheck disable=SC2086
    timeout 590 "${MPIRUN[@]}" -np 2 $LM $DECK $args ${LB_ARGS:-} --run.output="$OUT/8b_$name.h5" > "$OUT/8b_$name.log" 2>&1
    note "8b $name: rc=$? $(brief "$OUT/8b_$name.log")"
  done
fi
if has peer; then
  timeout 590 torchrun --nproc-per-node 2 $PEER fsdp --size 8b --precision bf16 --batch 2 --seq 32768 --attention sdpa \
    --ac --warmup 1 --iters 2 > "$OUT/peer.log" 2>&1
  note "peer: rc=$? $(tail -3 "$OUT/peer.log" | tr '\n' ' ')"
fi
note "done at $(( $(date +%s) - T0 )) s"
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude='*.h5' $(find . -name '*.log') 2>/dev/null)
find "$OUT" -name '*.log' -delete; find "$OUT" -name '*.h5' -delete
