#!/usr/bin/env bash
# One call on 2 GPUs (kind nvidia-h100-x2), carry [".deps", ".device"]: issue 17 part 1 with
# parallel.comm_sms (NCCL on at most N CTAs, the GEMMs that overlap it planned for the other SMs).
# Every stage appends to $OUT/summary.txt as it ends.
#   scripts/device/session_carve.sh [stages...]    stages: build tests dp peers [resume bench compile]
# tests: the carve-out GEMM test (GPU 0) and the 2-GPU suite's DDP/zero/fsdp and pp cases, with
#        and without comm_sms, against one GPU.
# dp:    xl bf16 flash, batch 4 x 512 per GPU: 1 GPU, then the 2-GPU runs in $RUNS, words
#        mode:grad_reduce_dtype:comm_sms (zero2 or bucketed; comm_sms 0 = NCCL's and cuBLASLt's
#        defaults, nccl8 = NCCL_MAX_CTAS=8 alone: NCCL capped, GEMMs planned for every SM).
# peers: torch.compile + SDPA on one GPU and torch DDP on 2 (torch_peer.py model / ddp);
#        compile: the first alone.
# resume: zero2 bf16 on 2 GPUs, a sharded checkpoint at step 6 resumed: losses bitwise.
# bench: bench-collectives all-reduce fp32 at comm_sms = 0, 8, 16 (busbw against NCCL's CTAs).
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests dp peers}
OUT=${OUT:-/tmp/session_carve_out}
source scripts/device/session_lib.sh
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$summary"
build_stage lmscale test_ops_cuda_math mpi_test_parallel_gpu
if has tests; then
  CUDA_VISIBLE_DEVICES=0 timeout 120 $BUILD/ctest/test_ops_cuda_math --gtest_filter='LinearTest.*' > "$OUT/math.log" 2>&1
  note "LinearTest (rc $?): $(grep -aE '^\[  (PASSED|FAILED)' "$OUT/math.log" | tr '\n' ' ') $(grep -a 'FAILED  \]' "$OUT/math.log" | head -4 | tr '\n' ' ')"
  timeout 300 "${MPIRUN[@]}" -np 2 $BUILD/ctest/parallel/mpi_test_parallel_gpu \
    --gtest_filter="${SUITE:-DataParallelGpu.EveryVariant*:PipelineGpu.TwoStages*}" > "$OUT/par_gpu.log" 2>&1
  note "2-GPU suite (rc $?): $(grep -aE '(PASSED|FAILED|SKIPPED)' "$OUT/par_gpu.log" | sort -u | head -8 | tr '\n' ' ')"
  grep -a "Failure\|comm_sms" "$OUT/par_gpu.log" | head -6 >> "$summary"
  note "tests done at $(( $(date +%s) - T0 )) s"
fi
XL=(inputs/bench_model_xl_bf16.ini --model.attention=flash)
H5=${H5:-/tmp/session_carve_h5}   # outputs stay off $OUT: a device call returns 8 files at most
mkdir -p "$H5"
if has dp; then
  CUDA_VISIBLE_DEVICES=0 timeout 100 $LM "${XL[@]}" --run.output="$H5/xl1.h5" > "$OUT/xl1.log" 2>&1
  note "1 GPU xl flash: $(brief "$OUT/xl1.log")"
  # RUNS: mode:grad_reduce_dtype:comm_sms words; mode zero2 or bucketed; comm_sms "nccl8" = NCCL_MAX_CTAS=8 alone.
  for run in ${RUNS:-zero2:fp32:0 bucketed:fp32:0 zero2:fp32:4 bucketed:fp32:4 zero2:fp32:8 bucketed:fp32:8 zero2:fp32:16 bucketed:fp32:16 zero2:fp32:nccl8}; do
    IFS=: read -r mode dtype sms <<< "$run"
    extra=(); [ $mode = bucketed ] && extra=(--parallel.zero=none)
    env_extra=()
    if [ "$sms" = nccl8 ]; then env_extra=(-x NCCL_MAX_CTAS=8); sms=0; fi
    tag=${run//:/_}
    timeout 100 "${MPIRUN[@]}" "${env_extra[@]}" -np 2 $LM inputs/ddp_xl_zero2.ini --model.attention=flash \
      --parallel.comm_sms=$sms --parallel.grad_reduce_dtype=$dtype "${extra[@]}" --run.output="$H5/dp_$tag.h5" \
      > "$OUT/dp_$tag.log" 2>&1
    note "2 GPU $run (rc $?): $(brief "$OUT/dp_$tag.log") $(grep -oE 'exposed communication [0-9.]+%' "$OUT/dp_$tag.log")"
  done
  note "dp done at $(( $(date +%s) - T0 )) s"
fi
if has resume; then
  # zero1/zero2 in bf16 keep the fp32 master whole only on demand (they gather the working copy):
  # a sharded checkpoint of zero2 on 2 GPUs resumed at step 6 must log A's losses bitwise
  # (naive attention: no atomics), and the resumed weights must be A's.
  # RESUME_EXE: another build (e.g. the previous commit's, carried) to run the same check with.
  LM_R=${RESUME_EXE:-$LM}
  R=(ctest/regression/tiny_train.ini --parallel.device=cuda --precision.mode=bf16 --model.attention=naive
     --parallel.zero=zero2 --optim.cosine_steps=12 --train.steps=12)
  rm -rf "$H5/ckA"
  timeout 100 "${MPIRUN[@]}" -np 2 $LM_R "${R[@]}" --run.output="$H5/resA.h5" --train.checkpoint_dir="$H5/ckA" \
    --train.checkpoint_every=6 > "$OUT/resume_A.log" 2>&1
  a=$?
  timeout 100 "${MPIRUN[@]}" -np 2 $LM_R "${R[@]}" --run.output="$H5/resB.h5" --train.resume="$H5/ckA/step_00000006" \
    > "$OUT/resume_B.log" 2>&1
  note "zero2 bf16 sharded resume (rc $a/$?): $(python3 - "$H5/resA.h5" "$H5/resB.h5" <<'PY'
import sys, h5py
a, b = (h5py.File(f, "r") for f in sys.argv[1:3])
la, lb = a["/train/steps"]["loss"], b["/train/steps"]["loss"]
sa, sb = a["/train/steps"]["step"], b["/train/steps"]["step"]
A = {int(s): float(l) for s, l in zip(sa, la)}
B = {int(s): float(l) for s, l in zip(sb, lb)}
common = sorted(set(A) & set(B))
same = all(A[s] == B[s] for s in common)
rel = max((abs(A[s] - B[s]) / abs(A[s]) for s in common), default=float("nan"))
print(f"steps compared {common[0] if common else None}..{common[-1] if common else None}: {'bitwise equal' if same and common else 'DIFFER'}",
      f"(max rel {rel:.2e}); step by step A {[A[s] for s in common]} B {[B[s] for s in common]}")
PY
)"
fi
if has bench; then
  for sms in ${BENCH_SMS:-0 8 16}; do
    timeout 100 "${MPIRUN[@]}" -np 2 $LM inputs/collectives_nccl.ini --parallel.comm_sms=$sms --bench.ops=all-reduce,reduce-scatter \
      --bench.dtypes=fp32 --bench.check=false --run.output="$H5/coll_$sms.h5" > "$OUT/coll_$sms.log" 2>&1
    note "collectives fp32 comm_sms $sms (rc $?):"; tail -8 "$OUT/coll_$sms.log" >> "$summary"
  done
fi
if has peers || has compile; then
  CUDA_VISIBLE_DEVICES=0 timeout ${PEER_TIMEOUT:-280} python3 $PEER model --size xl --precision bf16 --compile --attention sdpa \
    > "$OUT/torch_model.log" 2>&1
  note "torch.compile xl (1 GPU): $(grep '^{' "$OUT/torch_model.log" || tail -3 "$OUT/torch_model.log")"
fi
if has peers; then
  timeout 150 torchrun --nproc-per-node 2 $PEER ddp --size xl --precision bf16 --batch 4 --attention sdpa \
    > "$OUT/torch_ddp.log" 2>&1
  note "torch DDP xl (2 GPU, batch 4 per GPU): $(grep '^{' "$OUT/torch_ddp.log" || tail -3 "$OUT/torch_ddp.log")"
fi
note "total $(( $(date +%s) - T0 )) s"
cd "$OUT" && tar czf logs.tgz *.log 2>/dev/null && rm -f *.log
