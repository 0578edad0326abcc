#!/usr/bin/env bash
# One call on 2 GPUs (kind nvidia-h200-x2) for issue 12 (pipeline parallelism). Carry [".deps", ".device"].
#   scripts/device/session_pp.sh [stages...]    stages: build tests bench peer
# tests: the 2-GPU bf16 test (pipeline pp=2 against one GPU, and the data-parallel cases).
# bench: the 1-GPU xl step at batch 8 (the baseline), then pp=2 1f1b and gpipe (8 microbatches)
#        with their bubble summaries, and the analysis report with the timeline plots.
# peer:  torch.distributed.pipelining, same shape (1f1b, 8 microbatches), in the same call.
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests bench peer}
OUT=${OUT:-/tmp/session_pp_out}
source scripts/device/session_lib.sh

nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$summary"
build_stage lmscale mpi_test_parallel_gpu
if has tests; then
  timeout 240 "${MPIRUN[@]}" -np 2 "$BUILD/ctest/parallel/mpi_test_parallel_gpu" > "$OUT/test_parallel_gpu.log" 2>&1
  note "2-GPU tests: rc=$? $(grep -aE '^\[  (PASSED|FAILED)|^\[       OK|FAILED  \]' "$OUT/test_parallel_gpu.log" | tr '\n' ' ')"
fi
if has bench; then
  CUDA_VISIBLE_DEVICES=0 timeout 150 $LM inputs/pp_xl_1gpu.ini --run.output="$OUT/pp_1gpu.h5" > "$OUT/pp_1gpu.log" 2>&1
  note "1 GPU batch 8 (rc $?): $(grep -E '^step ' "$OUT/pp_1gpu.log")  $(grep -E 'peak memory' "$OUT/pp_1gpu.log")"
  for s in 1f1b gpipe; do
    timeout 150 "${MPIRUN[@]}" -np 2 $LM inputs/pp_xl_$s.ini --run.output="$OUT/pp_$s.h5" > "$OUT/pp_$s.log" 2>&1
    note "pp=2 $s (rc $?): $(grep -E '^step ' "$OUT/pp_$s.log")"
    grep -aE "^pipeline:|^  rank" "$OUT/pp_$s.log" | tee -a "$summary"
    grep -aiE "error" "$OUT/pp_$s.log" | head -3
  done
  python3 -m analysis.report "$OUT"/pp_*.h5 --out "$OUT/report" > "$OUT/report.log" 2>&1 || tail -5 "$OUT/report.log"
  note "bench stage done at $(( $(date +%s) - T0 )) s"
fi
if has peer; then
  timeout 200 torchrun --nproc-per-node 2 $PEER pp --size xl --precision bf16 --batch 8 --microbatches 8 \
    --schedule 1f1b --attention sdpa > "$OUT/torch_pp.log" 2>&1
  note "torch pp 1f1b: $(grep '^{' "$OUT/torch_pp.log" || tail -3 "$OUT/torch_pp.log")"
fi
echo "==== summary"; cat "$summary"
