#!/usr/bin/env bash
# One call on 1 GPU (kind nvidia-h100-x1 or nvidia-h200) for issue 16 items 3-5 (cost, pruning,
# real text). Carry [".deps", ".device"]. No new CUDA kernel: these check the GPU paths of the
# existing trainer with the new jobs and data source.
#   scripts/device/session_recipes.sh [stages...]    stages: build text prune cost
# text:  inputs/text_quickstart.ini on the GPU in fp32 and bf16 (loss below the unigram entropy),
#        saving the bf16 weights; with a price, the cost-to-finish column on the step lines.
# prune: unstructured fixed (0.9) and structured fixed (0.5) pruning of those weights in bf16;
#        structured export == masked loss per round (prune_check-style assertions on the table).
# cost:  bench-model xl bf16 for an MFU, then accounting of xl with cost.mfu_from that file.
set -uo pipefail
cd "$(dirname "$0")/../.."
stages=${*:-build text prune cost}
OUT=${OUT:-/tmp/session_recipes_out}
source scripts/device/session_lib.sh

nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$summary"
build_stage lmscale
if has text; then
  for p in fp32 bf16; do
    timeout 120 $LM inputs/text_quickstart.ini --parallel.device=cuda --precision.mode=$p \
      --run.output="$OUT/text_$p.h5" --train.save="$OUT/text_$p.weights.h5" \
      --cost.price_per_gpu_hour=3 > "$OUT/text_$p.log" 2>&1
    note "text $p (rc $?): $(grep -E '^step +300' "$OUT/text_$p.log") | $(grep -E '^final loss' "$OUT/text_$p.log")"
  done
fi
if has prune; then
  W=$OUT/text_bf16.weights.h5
  timeout 200 $LM inputs/text_quickstart.ini --parallel.device=cuda --precision.mode=bf16 --run.job=prune \
    --run.output="$OUT/prune_u.h5" --prune.weights="$W" --prune.target_sparsity=0.9 --prune.finetune_steps=10 \
    --prune.output="$OUT/pruned_u.h5" > "$OUT/prune_u.log" 2>&1
  note "prune unstructured bf16 (rc $?):"; grep -E '^ +[0-9]+ ' "$OUT/prune_u.log" | tee -a "$summary"
  timeout 200 $LM inputs/text_quickstart.ini --parallel.device=cuda --precision.mode=bf16 --run.job=prune \
    --run.output="$OUT/prune_s.h5" --prune.weights="$W" --prune.method=structured --prune.target_sparsity=0.5 \
    --prune.finetune_steps=10 --prune.output="$OUT/pruned_s.h5" > "$OUT/prune_s.log" 2>&1
  note "prune structured bf16 (rc $?):"; grep -E '^ +[0-9]+ ' "$OUT/prune_s.log" | tee -a "$summary"
  python3 - "$OUT" <<'PY' 2>&1 | tee -a "$summary"
import sys, h5py, numpy as np
out = sys.argv[1]
with h5py.File(f"{out}/pruned_u.h5") as f:
    n = z = 0
    for k in f:
        if k.startswith("layers.") and ("_proj" in k or ".ffn.w" in k):
            v = f[k][()]; n += v.size; z += int((v == 0).sum())
    print(f"unstructured export: {z} zeros of {n} (target {round(0.9 * n)}): {'OK' if z == round(0.9 * n) else 'MISMATCH'}")
with h5py.File(f"{out}/prune_s.h5") as f:
    r = f["/prune/rounds"][()][1:]
    rel = np.abs(r["export_val_loss"] - r["val_loss"]) / r["val_loss"]
    # bf16 GEMMs of another K may round differently: report, expect ~1e-3 at most.
    print(f"structured export vs masked (bf16): max rel {rel.max():.2e}; forward ms {r['forward_ms'].round(3).tolist()} -> {r['export_forward_ms'].round(3).tolist()}")
PY
  python3 -m analysis.report "$OUT"/prune_*.h5 --out "$OUT/report" > "$OUT/report.log" 2>&1 || tail -5 "$OUT/report.log"
fi
if has cost; then
  timeout 150 $LM inputs/bench_model_xl_bf16.ini --run.output="$OUT/bench_xl.h5" > "$OUT/bench_xl.log" 2>&1
  note "bench xl bf16 (rc $?): $(grep -oE 'MFU [0-9.]+%' "$OUT/bench_xl.log")"
  timeout 60 $LM inputs/accounting_xxl.ini --model.size=xl --precision.mode=bf16 --run.output="$OUT/cost_xl.h5" \
    --cost.tokens=3e10 --cost.gpus=64 --cost.mfu_from="$OUT/bench_xl.h5" --cost.price_per_gpu_hour=2.5 \
    --cost.spot_discount=0.6 --cost.preemptions_per_gpu_hour=0.002 > "$OUT/cost_xl.log" 2>&1
  note "accounting cost (rc $?):"; sed -n '/^cost of/,$p' "$OUT/cost_xl.log" | tee -a "$summary"
fi
echo "==== summary"; cat "$summary"
