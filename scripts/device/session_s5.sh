#!/usr/bin/env bash
# The 2026-11-26 session's device runs (docs/performance.md). Carry [".deps", ".device"].
#   scripts/device/session_s5.sh [stages...]
#   attn8b  (2 H200) build lmscale and the attention / model GPU tests, run both (one per GPU),
#           then the 8B deck with 3 timed steps (leaderboard_8b.sh run)
#   lb      (2 H200) leaderboard_8b.sh small run peer (the deck's 5 timed steps and the peer), then
#           xl bf16 flash on one GPU with the sm90 kernels and with FA2 (LMSCALE_FLASH_SM90=0)
#   zero2   (2 GPUs) the 2-GPU suite DataParallelGpu.*, then twice: xl on GPU 0 alone and zero2 on
#           both with parallel.overlap_param_gather = true and false
#   adamw   (1 GPU) the AdamW GPU tests, the bandwidth test, xl three times and the torch.compile
#           peer; adamw_variants.cu (kernel variants, standalone)
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-attn8b lb}
OUT=${OUT:-/tmp/session_s5_out}
source scripts/device/session_lib.sh
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee -a "$summary"
XL=(inputs/bench_model_xl_bf16.ini --model.attention=flash)
steps() { grep -E '^(step|forward|backward|comm|optimizer) ' "$1" | awk '{print $1, $2}' | tr '\n' ' '; }
if has attn8b; then
  scripts/device/build.sh lmscale test_attention_cuda test_model_cuda > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
  (CUDA_VISIBLE_DEVICES=0 timeout 240 $BUILD/ctest/test_attention_cuda --gtest_brief=1 > "$OUT/attn.log" 2>&1
   note "test_attention_cuda rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/attn.log" | head -3 | tr '\n' ' ')") &
  (CUDA_VISIBLE_DEVICES=1 timeout 240 $BUILD/ctest/test_model_cuda --gtest_brief=1 > "$OUT/model.log" 2>&1
   note "test_model_cuda rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/model.log" | head -3 | tr '\n' ' ')") &
  wait
  OUT=$OUT/lb RUNS=deck LB_ARGS=--bench.steps=3 bash scripts/device/leaderboard_8b.sh run
fi
if has lb; then
  OUT=$OUT/lb RUNS=deck bash scripts/device/leaderboard_8b.sh small run peer
  for v in sm90:1 fa2:0; do
    CUDA_VISIBLE_DEVICES=0 LMSCALE_FLASH_SM90=${v#*:} timeout 200 $LM "${XL[@]}" --run.output=/tmp/xl.h5 > "$OUT/xl_${v%%:*}.log" 2>&1
    note "xl ${v%%:*}: rc=$? $(steps "$OUT/xl_${v%%:*}.log")"
  done
fi
if has zero2; then
  build_stage lmscale mpi_test_parallel_gpu
  timeout 240 "${MPIRUN[@]}" -np 2 $BUILD/ctest/parallel/mpi_test_parallel_gpu --gtest_filter='DataParallelGpu.*' > "$OUT/par.log" 2>&1
  note "DataParallelGpu rc=$? $(grep -aE 'PASSED|FAILED' "$OUT/par.log" | sort -u | tr '\n' ' ')"
  for rep in 1 2; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 $LM "${XL[@]}" --run.output=/tmp/xl1.h5 > "$OUT/xl1_$rep.log" 2>&1
    note "1 GPU ($rep): $(brief "$OUT/xl1_$rep.log")"
    for g in true false; do
      timeout 120 "${MPIRUN[@]}" -np 2 $LM inputs/ddp_xl_zero2.ini --model.attention=flash --parallel.overlap_param_gather=$g \
        --run.output=/tmp/z2.h5 > "$OUT/z2_${g}_$rep.log" 2>&1
      note "zero2 overlap_param_gather=$g ($rep): $(brief "$OUT/z2_${g}_$rep.log")"
    done
  done
fi
if has adamw; then
  build_stage lmscale test_ops_cuda_elementwise test_optimizer_steps_cuda
  for t in test_ops_cuda_elementwise test_optimizer_steps_cuda; do
    timeout 200 $BUILD/ctest/$t --gtest_brief=1 > "$OUT/$t.log" 2>&1
    note "$t rc=$? $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
  done
  timeout 200 $BUILD/ctest/test_ops_cuda_elementwise --gtest_also_run_disabled_tests --gtest_filter='Bandwidth.DISABLED_ModelScale' \
    > "$OUT/bw.log" 2>&1
  grep -E "^BW (adamw|sum_sq|copy)" "$OUT/bw.log" | tee -a "$summary"
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a scripts/device/adamw_variants.cu -o /tmp/adamw_variants &&
    /tmp/adamw_variants | tee -a "$summary"
  for rep in 1 2 3; do
    timeout 120 $LM "${XL[@]}" --run.output=/tmp/xl1.h5 > "$OUT/xl1_$rep.log" 2>&1
    note "1 GPU xl ($rep): $(steps "$OUT/xl1_$rep.log")"
  done
  timeout 300 python3 $PEER model --size xl --precision bf16 --compile --attention sdpa > "$OUT/peer.log" 2>&1
  note "torch.compile xl: rc=$? $(grep '^{' "$OUT/peer.log" || tail -3 "$OUT/peer.log")"
fi
note "total $(( $(date +%s) - T0 )) s"
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz $(find . -maxdepth 1 -name '*.log') 2>/dev/null; rm -f ./*.log)
