#!/usr/bin/env bash
# The memory-prediction validation table on one GPU (docs/performance.md, "Memory predictions"). For each row, bench-model runs the
# deck (batch 4, 1 warm-up + 2 steps) and prints its measured peak (the caching allocator's
# high-water mark) and the accounting's prediction for the phases that mode runs; the table
# (measured, predicted, error) goes to $OUT/memory_validation.md and the summary.
#   scripts/gpu/memory_validation.sh [rows]   rows: "preset ctx precision mode attention;..."
# Needs a built $BUILD/lmscale (scripts/gpu/build.sh lmscale); the default rows need an 80 GB GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/memory_validation_out}
source scripts/gpu/env.sh
mkdir -p "$OUT"
LM=$BUILD/lmscale
T0=$(date +%s)
summary=$OUT/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
default_rows=""
for ctx in 128 512 2048; do for p in fp32 bf16; do for m in forward forward-backward train-step; do
  default_rows+="small $ctx $p $m naive;"; done; done; done
for ctx in 128 512 2048; do for m in forward train-step; do default_rows+="xl $ctx bf16 $m naive;"; done; done
default_rows+="xl 512 fp32 train-step naive;xl 2048 bf16 train-step flash;"
for ctx in 128 512; do for m in forward forward-backward train-step; do default_rows+="2.7B $ctx bf16 $m naive;"; done; done
default_rows+="2.7B 2048 bf16 train-step flash"
IFS=';' read -ra rows <<< "${1:-$default_rows}"
table=$OUT/memory_validation.md
echo "| preset | context | precision | mode | attention | measured (GiB) | predicted (GiB) | error |" > "$table"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |" >> "$table"
for r in "${rows[@]}"; do
  read -r size ctx prec mode attn <<< "$r"
  [ -z "$size" ] && continue
  log=$OUT/mem_${size}_${ctx}_${prec}_${mode}_${attn}.log
  timeout 120 $LM inputs/bench_model_xl_bf16.ini --model.size="$size" --model.context_length="$ctx" \
    --precision.mode="$prec" --bench.mode="$mode" --model.attention="$attn" --bench.batch_size=4 \
    --bench.warmup=1 --bench.steps=2 --run.output="$OUT/mem_${size}_${ctx}_${prec}_${mode}_${attn}.h5" > "$log" 2>&1
  rc=$?
  meas=$(grep -oE 'peak memory [0-9.]+ GiB' "$log" | grep -oE '[0-9.]+' | tail -1)
  pred=$(grep -oE 'predicted peak \(accounting\) [0-9.]+ GiB' "$log" | grep -oE '[0-9.]+' | tail -1)
  if [ -n "$meas" ] && [ -n "$pred" ]; then
    err=$(python3 -c "print(f'{($pred - $meas) / $meas * 100:+.1f}%')")
  else
    err="rc $rc: $(grep -aiE 'error|out of memory' "$log" | head -1 | cut -c1-80)"
  fi
  echo "| $size | $ctx | $prec | $mode | $attn | ${meas:--} | ${pred:--} | $err |" >> "$table"
done
note "memory validation ($(( $(date +%s) - T0 )) s):"
cat "$table" | tee -a "$summary"
python3 - "$table" <<'PY' | tee -a "$summary"
import sys
errs = []
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split("|")[1:-1]]
    if len(f) == 8 and f[7].endswith("%"): errs.append(abs(float(f[7].rstrip("%"))))
if errs: print(f"rows {len(errs)}, within 5%: {sum(e <= 5 for e in errs)}, max |error| {max(errs):.1f}%")
PY
