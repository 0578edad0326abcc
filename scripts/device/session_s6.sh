#!/usr/bin/env bash
# The 2026-11-26 (second) session's device runs (docs/performance.md). Carry [".deps", ".device"].
#   scripts/device/session_s6.sh [stages...]
#   build  build lmscale and the 2-GPU suite
#   tests  (2 GPUs) DataParallelGpu.* (zero2 with the copy-engine exchange against NCCL, bitwise)
#   dp     (2 GPUs) twice in turn: xl bf16 flash on GPU 0 alone, zero2 over NCCL, zero2 with
#          parallel.grad_exchange = copy-engine; then bucketed DDP once; memory per phase of the
#          copy-engine run
#   loss   (2 GPUs) 200 steps of a 8-layer d 512 model on inputs/text (text_quickstart.ini, bf16,
#          zero2): gradients reduced in fp32 over NCCL, in bf16 over NCCL, and by the copy engines
#   trace  (2 GPUs) zero2 copy-engine xl with run.trace: the peer copies on the p2p track
#   peers  torch.compile + SDPA on one GPU and torch DDP on 2 (issue 17's peers)
#   sdpa   (1 GPU) issue 13's two shapes under torch SDPA's default choice (and the kernels it
#          launches) and pinned to FlashAttention-2 and to cuDNN; run after
#          `BWD_OLD=" " scripts/device/session_bwd.sh build time` (our kernels in the same call)
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build tests dp}
OUT=${OUT:-/tmp/session_s6_out}
source scripts/device/session_lib.sh
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee -a "$summary"
XL=(inputs/bench_model_xl_bf16.ini --model.attention=flash)
Z2=(inputs/ddp_xl_zero2.ini --model.attention=flash)
build_stage lmscale mpi_test_parallel_gpu
if has tests; then
  timeout 300 "${MPIRUN[@]}" -np 2 $BUILD/ctest/parallel/mpi_test_parallel_gpu --gtest_filter="${SUITE:-DataParallelGpu.*}" --gtest_color=no \
    > "$OUT/par.log" 2>&1
  note "${SUITE:-DataParallelGpu.*} rc=$? $(grep -aE '^\[  (PASSED|FAILED)|^\[       OK|Failure' "$OUT/par.log" | sort -u | tr '\n' ' ')"
fi
if has dp; then
  for rep in 1 2; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 $LM "${XL[@]}" --run.output=/tmp/xl1.h5 > "$OUT/xl1_$rep.log" 2>&1
    note "1 GPU ($rep): $(brief "$OUT/xl1_$rep.log")"
    for x in nccl copy-engine; do
      timeout 150 "${MPIRUN[@]}" -np 2 $LM "${Z2[@]}" --parallel.grad_exchange=$x --run.output=/tmp/z2_$x.h5 \
        > "$OUT/z2_${x}_$rep.log" 2>&1
      note "zero2 grad_exchange=$x ($rep): rc=$? $(brief "$OUT/z2_${x}_$rep.log")"
    done
  done
  memrows /tmp/z2_copy-engine.h5
  timeout 150 "${MPIRUN[@]}" -np 2 $LM "${Z2[@]}" --parallel.zero=none --run.output=/tmp/ddp.h5 > "$OUT/ddp.log" 2>&1
  note "bucketed DDP: $(brief "$OUT/ddp.log")"
fi
if has trace; then
  timeout 150 "${MPIRUN[@]}" -np 2 $LM inputs/ddp_xl_zero2_copy_engine.ini --bench.steps=3 --run.output=/tmp/ce.h5 \
    --run.trace=/tmp/ce.trace.json > "$OUT/ce_trace.log" 2>&1
  note "zero2 copy-engine deck with run.trace: rc=$? $(brief "$OUT/ce_trace.log")"
  p2p_summary /tmp/ce.trace.json
fi
if has loss; then
  TQ=(inputs/text_quickstart.ini --parallel.device=cuda --parallel.backend=nccl --precision.mode=bf16 --parallel.zero=zero2
      --model.d_model=512 --model.d_ff=1376 --model.num_layers=8 --model.num_heads=8 --model.context_length=256
      --train.batch_size=32 --train.steps=200 --train.log_every=20 --train.eval_every=100 --optim.warmup_steps=20)
  for v in fp32:nccl bf16:nccl fp32:copy-engine; do
    timeout 150 "${MPIRUN[@]}" -np 2 $LM "${TQ[@]}" --parallel.grad_reduce_dtype=${v%%:*} --parallel.grad_exchange=${v#*:} \
      --run.output=/tmp/tq_${v%%:*}_${v#*:}.h5 > "$OUT/tq_${v%%:*}_${v#*:}.log" 2>&1
    note "200 steps reduce=${v%%:*} exchange=${v#*:}: rc=$? $(grep -E '^step +(20|100|200)/|^eval|^final' "$OUT/tq_${v%%:*}_${v#*:}.log" | awk '{printf "%s %s %s %s; ", $1, $2, $3, $4}')"
  done
  python3 - <<'PY' | tee -a "$summary"
import h5py, numpy as np
def losses(v):
    return np.asarray(h5py.File(f"/tmp/tq_{v}.h5", "r")["/train/steps"]["loss"], dtype=float)
a, b, c = (losses(v) for v in ("fp32_nccl", "bf16_nccl", "fp32_copy-engine"))
print(f"bf16 vs fp32 reduction over {len(a)} steps: max |dloss| {np.max(np.abs(a-b)):.3e}, last 20 steps mean {a[-20:].mean():.5f} vs {b[-20:].mean():.5f}")
print(f"copy-engine vs nccl (fp32): identical losses: {np.array_equal(a, c)} (max |dloss| {np.max(np.abs(a-c)):.3e})")
PY
fi
if has peers; then
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 $PEER model --size xl --precision bf16 --compile --attention sdpa > "$OUT/peer.log" 2>&1
  note "torch.compile xl: rc=$? $(grep '^{' "$OUT/peer.log" || tail -3 "$OUT/peer.log")"
  timeout 200 torchrun --nproc-per-node 2 $PEER ddp --size xl --precision bf16 --batch 4 --attention sdpa > "$OUT/ddp_peer.log" 2>&1
  note "torch DDP xl: rc=$? $(grep '^{' "$OUT/ddp_peer.log" || tail -3 "$OUT/ddp_peer.log")"
fi
if has sdpa; then
  for sh in "1 16 16384 64" "1 32 32768 128"; do
    read -r b h t d <<< "$sh"
    for be in default flash cudnn; do
      k=; [ $be = default ] && k=--kernels
      timeout 120 python3 scripts/device/attention_sdpa_time.py --batch "$b" --heads "$h" --seq "$t" --head-dim "$d" \
        --causal --iters 20 --backend $be $k > "$OUT/sdpa_${be}_$d.log" 2>&1
      note "sdpa $be d$d: rc=$? $(grep -E '^(kernels|\{)' "$OUT/sdpa_${be}_$d.log" | tr '\n' ' ' || tail -2 "$OUT/sdpa_${be}_$d.log")"
    done
  done
fi
note "total $(( $(date +%s) - T0 )) s"
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz $(find . -maxdepth 1 -name '*.log') 2>/dev/null; rm -f ./*.log)
