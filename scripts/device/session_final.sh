#!/usr/bin/env bash
# A short call on 2 GPUs (kind nvidia-h200-x2) after merging: the gpu tests of every parallel mode
# and a sharded-checkpoint resume on 2 GPUs in bf16 (zero2 and fsdp: the losses after resuming at
# step 6 must equal the uninterrupted run's bitwise). Carry [".deps"].
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/env.sh
OUT=${OUT:-/tmp/session_final_out}
mkdir -p "$OUT"
export BUILD=${BUILD:-build-device}
LM=$BUILD/lmscale
MPIRUN=(mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH)
T0=$(date +%s)
scripts/device/build.sh lmscale mpi_test_parallel_gpu test_model_cuda > "$OUT/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
echo "build done at $(( $(date +%s) - T0 )) s"
timeout 240 "${MPIRUN[@]}" -np 2 "$BUILD/ctest/parallel/mpi_test_parallel_gpu" > "$OUT/test_parallel_gpu.log" 2>&1
echo "parallel gpu tests: rc=$? $(grep -aE 'OK \]|FAILED|PASSED' "$OUT/test_parallel_gpu.log" | sed 's/\x1b\[[0-9;]*m//g' | tr '\n' ' ')"
timeout 120 "$BUILD/ctest/test_model_cuda" --gtest_brief=1 > "$OUT/test_model_cuda.log" 2>&1
echo "model cuda test: rc=$? $(grep -aE 'PASSED|FAILED' "$OUT/test_model_cuda.log" | tr '\n' ' ')"
cd "$OUT"
deck=$OLDPWD/ctest/regression/tiny_train.ini
common=(--parallel.device=cuda --precision.mode=bf16 --model.attention=flash --optim.cosine_steps=12 --train.steps=12)
for z in zero2 fsdp; do
  timeout 120 "${MPIRUN[@]}" -np 2 "$OLDPWD/$LM" "$deck" "${common[@]}" --parallel.zero=$z --run.output=A_$z.h5 \
    --train.checkpoint_dir=ck_$z --train.checkpoint_every=6 > A_$z.log 2>&1 || { echo "$z A failed"; tail -5 A_$z.log; }
  timeout 120 "${MPIRUN[@]}" -np 2 "$OLDPWD/$LM" "$deck" "${common[@]}" --parallel.zero=$z --run.output=B_$z.h5 \
    --train.resume=ck_$z/step_00000006 > B_$z.log 2>&1 || { echo "$z B failed"; tail -5 B_$z.log; }
  python3 - "$z" <<'PY'
import h5py, sys
z = sys.argv[1]
with h5py.File(f"A_{z}.h5") as a, h5py.File(f"B_{z}.h5") as b:
    la, lb = list(a["/train/steps"]["loss"][6:]), list(b["/train/steps"]["loss"])
    print(f"{z} bf16 resume on 2 GPUs: {'bitwise equal' if la == lb else 'DIFFERENT'}: {la} vs {lb}")
PY
done
echo "done at $(( $(date +%s) - T0 )) s"
