#!/usr/bin/env bash
# The 2026-11-26 (third) session's device runs (docs/performance.md). Carry [".deps", ".device"].
#   scripts/device/session_s7.sh [stages...]
#   build  build lmscale and the 2-GPU suite
#   tests  (2 GPUs) $SUITE (default DataParallelGpu.*: among them the copy-engine tests, bucketed DDP
#          and zero2, against NCCL bitwise)
#   dp     (2 GPUs) twice in turn: xl bf16 flash on GPU 0 alone, bucketed DDP and zero2 with
#          parallel.grad_exchange = copy-engine (and over NCCL in the first round); memory per
#          phase of both copy-engine runs
#   trace  (2 GPUs) bucketed DDP copy-engine xl with run.trace: the copies on the p2p track
#   peers  torch.compile + SDPA on one GPU and torch DDP on 2 (issue 17's peers)
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests dp}
OUT=${OUT:-/tmp/session_s7_out}
source scripts/device/session_lib.sh
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee -a "$summary"
XL=(inputs/bench_model_xl_bf16.ini --model.attention=flash)
Z2=(inputs/ddp_xl_zero2.ini --model.attention=flash)
DDP=(inputs/ddp_xl_zero2.ini --model.attention=flash --parallel.zero=none --parallel.ddp=bucketed)
build_stage lmscale mpi_test_parallel_gpu
if has tests; then
  timeout 300 "${MPIRUN[@]}" -np 2 $BUILD/ctest/parallel/mpi_test_parallel_gpu \
    --gtest_filter="${SUITE:-DataParallelGpu.*}" --gtest_color=no > "$OUT/par.log" 2>&1
  note "${SUITE:-DataParallelGpu.*} rc=$? $(grep -aE '^\[  (PASSED|FAILED)|^\[       OK|Failure|^bucketed|^zero2' "$OUT/par.log" | sort -u | tr '\n' ' ')"
fi
if has dp; then
  for rep in 1 2; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 $LM "${XL[@]}" --run.output=/tmp/xl1.h5 > "$OUT/xl1_$rep.log" 2>&1
    note "1 GPU ($rep): $(brief "$OUT/xl1_$rep.log")"
    xs="copy-engine"; [ $rep = 1 ] && xs="nccl copy-engine"
    for x in $xs; do
      timeout 150 "${MPIRUN[@]}" -np 2 $LM "${DDP[@]}" --parallel.grad_exchange=$x --run.output=/tmp/ddp_$x.h5 \
        > "$OUT/ddp_${x}_$rep.log" 2>&1
      note "bucketed DDP grad_exchange=$x ($rep): rc=$? $(brief "$OUT/ddp_${x}_$rep.log") comm $(grep -E '^comm ' "$OUT/ddp_${x}_$rep.log" | awk '{print $2}')"
      timeout 150 "${MPIRUN[@]}" -np 2 $LM "${Z2[@]}" --parallel.grad_exchange=$x --run.output=/tmp/z2_$x.h5 \
        > "$OUT/z2_${x}_$rep.log" 2>&1
      note "zero2 grad_exchange=$x ($rep): rc=$? $(brief "$OUT/z2_${x}_$rep.log") comm $(grep -E '^comm ' "$OUT/z2_${x}_$rep.log" | awk '{print $2}')"
    done
  done
  memrows /tmp/ddp_copy-engine.h5
  memrows /tmp/z2_copy-engine.h5
fi
if has trace; then
  timeout 150 "${MPIRUN[@]}" -np 2 $LM "${DDP[@]}" --parallel.grad_exchange=copy-engine --bench.steps=3 \
    --run.output=/tmp/ce.h5 --run.trace=/tmp/ce.trace.json > "$OUT/ce_trace.log" 2>&1
  note "bucketed DDP copy-engine with run.trace: rc=$? $(brief "$OUT/ce_trace.log")"
  p2p_summary /tmp/ce.trace.json
  gzip -c /tmp/ce.trace.json > "$OUT/ce.trace.json.gz"
fi
if has peers; then
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 $PEER model --size xl --precision bf16 --compile --attention sdpa > "$OUT/peer.log" 2>&1
  note "torch.compile xl: rc=$? $(grep '^{' "$OUT/peer.log" || tail -3 "$OUT/peer.log")"
  timeout 200 torchrun --nproc-per-node 2 $PEER ddp --size xl --precision bf16 --batch 4 --attention sdpa > "$OUT/ddp_peer.log" 2>&1
  note "torch DDP xl: rc=$? $(grep '^{' "$OUT/ddp_peer.log" || tail -3 "$OUT/ddp_peer.log")"
fi
note "total $(( $(date +%s) - T0 )) s"
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz $(find . -maxdepth 1 -name '*.log') 2>/dev/null; rm -f ./*.log)
