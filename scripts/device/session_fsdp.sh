#!/usr/bin/env bash
# One call on 2 GPUs (kind nvidia-h200-x2) for issue 10 (FSDP and activation checkpointing).
# Carry [".deps", ".device"].   scripts/device/session_fsdp.sh [stages...]
#   build    build everything on the device
#   tests    the 2-GPU parallel test (every DDP/ZeRO variant, FSDP, checkpointing vs one GPU, bf16)
#            and the 1-GPU model test
#   fsdp_context  the 1-GPU xl step at batch 4, zero2 and fsdp with prefetch 0 (gather on demand)
#   fsdp     xl bf16 flash, global batch 8 on 2 GPUs: fsdp, fsdp + full / selective /
#            selective-mlp checkpointing; torch FSDP2 with and without --ac
#   ckpt     the CS336 checkpointing study on one GPU each (two runs at a time): d 2560, F 10240,
#            32 layers, 16 heads, batch 4 x 2048: none, selective(-mlp), every-k for k = 1, 2, 4, 8, 16
#   batch    fsdp with and without full checkpointing at global batch 16, 32, 64
#   zero2_27b  issue 20: the 2.7B preset (head dim 80) with flash, bf16, zero2 on 2 GPUs (4 x 512
#            per GPU) beside one GPU at batch 4 and torch_peer.py model --size 2.7B (sdpa)
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests fsdp_context fsdp ckpt batch zero2_27b}
OUT=${OUT:-/tmp/session_fsdp_out}
source scripts/device/session_lib.sh

nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$summary"
if has build; then
  scripts/device/build.sh > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
  note "build done at $(( $(date +%s) - T0 )) s"
fi
if has tests; then
  timeout 240 "${MPIRUN[@]}" -np 2 "$BUILD/ctest/parallel/mpi_test_parallel_gpu" > "$OUT/test_parallel_gpu.log" 2>&1
  note "parallel gpu test (2 GPUs): rc=$? $(grep -aE 'PASSED|FAILED|Expected|actual' "$OUT/test_parallel_gpu.log" | head -12 | tr '\n' ' ')"
  timeout 120 "$BUILD/ctest/test_vocab_parallel_cuda" --gtest_brief=1 > "$OUT/test_vocab_parallel_cuda.log" 2>&1
  note "vocab-parallel cuda kernels: rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/test_vocab_parallel_cuda.log" | tr '\n' ' ')"
  timeout 120 "$BUILD/ctest/test_model_cuda" --gtest_brief=1 > "$OUT/test_model_cuda.log" 2>&1
  note "model cuda test: rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/test_model_cuda.log" | tr '\n' ' ')"
  note "tests done at $(( $(date +%s) - T0 )) s"
fi
if has fsdp_context; then   # the 1-GPU step and zero2 beside which fsdp is judged
  FL=(--model.attention=flash --bench.warmup=3 --bench.steps=8)
  CUDA_VISIBLE_DEVICES=0 timeout 120 $LM inputs/bench_model_xl_bf16.ini "${FL[@]}" --run.output="$OUT/xl_1gpu.h5" > "$OUT/xl_1gpu.log" 2>&1
  note "1 GPU xl flash batch 4: $(brief "$OUT/xl_1gpu.log")"
  timeout 120 "${MPIRUN[@]}" -np 2 $LM inputs/ddp_xl_zero2.ini "${FL[@]}" --run.output="$OUT/zero2.h5" > "$OUT/zero2.log" 2>&1
  note "zero2: $(brief "$OUT/zero2.log")"
  timeout 120 "${MPIRUN[@]}" -np 2 $LM inputs/fsdp_xl.ini --parallel.fsdp_prefetch=0 --run.output="$OUT/fsdp_xl_prefetch0.h5" > "$OUT/fsdp_xl_prefetch0.log" 2>&1
  note "fsdp_xl prefetch 0: $(brief "$OUT/fsdp_xl_prefetch0.log")"
fi
if has fsdp; then
  for d in fsdp_xl fsdp_xl_full_ac fsdp_xl_selective_ac; do
    timeout 120 "${MPIRUN[@]}" -np 2 $LM inputs/$d.ini --run.output="$OUT/$d.h5" > "$OUT/$d.log" 2>&1
    note "$d: $(brief "$OUT/$d.log")"
  done
  timeout 120 "${MPIRUN[@]}" -np 2 $LM inputs/fsdp_xl_selective_ac.ini --train.activation_checkpointing=selective-mlp \
    --run.output="$OUT/fsdp_xl_selective_mlp_ac.h5" > "$OUT/fsdp_xl_selective_mlp_ac.log" 2>&1
  note "fsdp_xl selective-mlp: $(brief "$OUT/fsdp_xl_selective_mlp_ac.log")"
  timeout 150 torchrun --nproc-per-node 2 $PEER fsdp --size xl --precision bf16 --batch 8 --attention sdpa > "$OUT/torch_fsdp.log" 2>&1
  note "torch fsdp: $(grep '^{' "$OUT/torch_fsdp.log" || tail -3 "$OUT/torch_fsdp.log")"
  timeout 150 torchrun --nproc-per-node 2 $PEER fsdp --size xl --precision bf16 --batch 8 --attention sdpa --ac > "$OUT/torch_fsdp_ac.log" 2>&1
  note "torch fsdp --ac: $(grep '^{' "$OUT/torch_fsdp_ac.log" || tail -3 "$OUT/torch_fsdp_ac.log")"
  note "fsdp stage done at $(( $(date +%s) - T0 )) s"
fi
if has ckpt; then
  study() {   # gpu name args...
    local gpu=$1 name=$2; shift 2
    CUDA_VISIBLE_DEVICES=$gpu timeout 150 $LM inputs/checkpointing_study.ini "$@" --run.output="$OUT/ckpt_$name.h5" > "$OUT/ckpt_$name.log" 2>&1
  }
  ( study 0 none --train.activation_checkpointing=none; study 0 k1 --train.checkpoint_k=1; study 0 k4 --train.checkpoint_k=4;
    study 0 k16 --train.checkpoint_k=16 ) &
  ( study 1 selective --train.activation_checkpointing=selective; study 1 k2 --train.checkpoint_k=2; study 1 k8 --train.checkpoint_k=8;
    study 1 selective_mlp --train.activation_checkpointing=selective-mlp ) &
  wait
  for n in none selective selective_mlp k1 k2 k4 k8 k16; do note "checkpointing study $n: $(brief "$OUT/ckpt_$n.log")"; done
  note "ckpt stage done at $(( $(date +%s) - T0 )) s"
fi
if has batch; then
  for b in 16 32 64; do
    for d in fsdp_xl fsdp_xl_full_ac; do
      timeout 120 "${MPIRUN[@]}" -np 2 $LM inputs/$d.ini --bench.batch_size=$b --bench.warmup=2 --bench.steps=4 \
        --run.output="$OUT/${d}_b$b.h5" > "$OUT/${d}_b$b.log" 2>&1
      note "$d batch $b: $(brief "$OUT/${d}_b$b.log") tokens/s $(grep -oE 'tokens/s [0-9.]+' "$OUT/${d}_b$b.log" | awk '{print $2}')"
    done
  done
  note "batch stage done at $(( $(date +%s) - T0 )) s"
fi
if has zero2_27b; then
  B27=(inputs/bench_model_xl_bf16.ini --model.size=2.7B --model.attention=flash --bench.warmup=3 --bench.steps=6)
  CUDA_VISIBLE_DEVICES=0 timeout 150 $LM "${B27[@]}" --run.output="$OUT/b27_1gpu.h5" > "$OUT/b27_1gpu.log" 2>&1
  note "2.7B flash 1 GPU batch 4: $(brief "$OUT/b27_1gpu.log")"
  timeout 150 "${MPIRUN[@]}" -np 2 $LM "${B27[@]}" --parallel.zero=zero2 --parallel.ddp=bucketed --parallel.bucket_mb=100 \
    --bench.batch_size=8 --run.output="$OUT/b27_zero2.h5" > "$OUT/b27_zero2.log" 2>&1
  note "2.7B flash zero2 2 GPUs batch 8: $(brief "$OUT/b27_zero2.log")"
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 $PEER model --size 2.7B --precision bf16 --batch 4 --attention sdpa > "$OUT/torch_27b.log" 2>&1
  note "torch 2.7B sdpa 1 GPU: $(grep '^{' "$OUT/torch_27b.log" || tail -3 "$OUT/torch_27b.log")"
  note "zero2_27b stage done at $(( $(date +%s) - T0 )) s"
fi
echo "==== summary"; cat "$summary"
