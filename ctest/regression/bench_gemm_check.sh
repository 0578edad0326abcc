#!/usr/bin/env bash
# ctest regression.bench_gemm: bench_gemm_check.sh LMSCALE CHECK_TABLE OUTDIR
# run.job = bench-gemm on the CPU with a tiny model (fp32 and the fp8 emulation): exit 0, one row
# per (GEMM, precision, variant) with the block's and the head's shapes, positive rates, the
# block totals' FLOPs; then each refused input exits 2 naming its key and leaves no results file.
set -uo pipefail
lmscale=$1 check_table=$2 outdir=$3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
rm -rf "$outdir"
mkdir -p "$outdir"
cd "$outdir" || exit 1
fails=0
check() {   # check MESSAGE COMMAND...
  if "${@:2}"; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi
}
# rows = batch 2 x context 16 = 32; d = 32, F = 96, V = 97.
tiny=(--run.job=bench-gemm --parallel.device=cpu --model.size=custom --model.vocab_size=97 --model.d_model=32
      --model.num_layers=2 --model.num_heads=4 --bench.batch_size=2 --bench.warmup=1 --bench.steps=3)
shape=(--model.context_length=16 --model.d_ff=96)
"$lmscale" "${tiny[@]}" "${shape[@]}" --bench.gemm_precisions=fp32,fp8 --run.output=gemm.h5 >stdout 2>stderr
rc=$?
check "tiny bench-gemm exited $rc, expected 0" test "$rc" -eq 0
cat stdout
# The rows in order: fp32 has 5 layers x 3 passes; fp8 the block's 4 layers x 3 passes, each as
# "gemm" and "gemm+casts". Per layer (out, in, group): qkv (32, 32, 3), o (32, 32, 1),
# w1w3 (96, 32, 2), w2 (32, 96, 1), lm_head (97, 32, 1); forward (32, out, in), dx (32, in, out),
# dW (out, in, 32).
fp32_mnk="32 32 32|32 32 32|32 32 32|32 32 32|32 32 32|32 32 32|32 96 32|32 32 96|96 32 32|32 32 96|32 96 32|32 96 32|32 97 32|32 32 97|97 32 32"
expect_m= expect_n= expect_k=
add_rows() {   # add_rows "m n k|m n k|..." REPEAT: each shape REPEAT times
  local IFS='|' shape i
  for shape in $1; do
    for ((i = 0; i < $2; i++)); do
      IFS=' ' read -r m n k <<<"$shape"
      expect_m+="$m"$'\n' expect_n+="$n"$'\n' expect_k+="$k"$'\n'
    done
  done
}
add_rows "$fp32_mnk" 1
add_rows "${fp32_mnk%|32 97 32|32 32 97|97 32 32}" 2
printf '%s' "$expect_m" >m.golden
printf '%s' "$expect_n" >n.golden
printf '%s' "$expect_k" >k.golden
for c in m n k; do
  check "column $c of /bench_gemm/results" "$check_table" gemm.h5 /bench_gemm/results "$c" "$c.golden" 0
done
"$check_table" gemm.h5 /bench_gemm/results tflops - 0 >tflops.txt
check "39 rows of TFLOP/s" test "$(wc -l <tflops.txt)" -eq 39
check "every TFLOP/s positive" awk '!($1 > 0) { bad = 1 } END { exit bad }' tflops.txt
# The block totals: fp32 gemm, fp8 gemm, fp8 gemm+casts; each sums the block's 12 GEMMs:
# 3 passes x 2 * 32 * (3*32*32 + 32*32 + 2*96*32 + 32*96) = 2555904 FLOP.
printf '2555904\n2555904\n2555904\n' >flops.golden
check "block totals' FLOPs" "$check_table" gemm.h5 /bench_gemm/totals flops flops.golden 0
"$check_table" gemm.h5 /bench_gemm/totals tflops - 0 >total_tflops.txt
check "three positive block totals" awk '!($1 > 0) { bad = 1 } END { exit bad || NR != 3 }' total_tflops.txt
check "stdout has the block totals" grep -q "^block total" stdout
# precision.fp8_fast_accum (default forward) is named, and the CPU's fp8 rows say fp64: the
# emulation sums exactly and ignores the setting (docs/precision.md).
check "stdout names the fp8 accumulation setting" grep -qF "fp8 accumulation: precision.fp8_fast_accum = forward" stdout
check "the CPU's fp8 rows accumulate in fp64" grep -qE "^qkv +forward +fp8 +gemm +fp64 " stdout
check "the fp32 rows accumulate in fp32" grep -qE "^qkv +forward +fp32 +gemm +fp32 " stdout

refused() {   # refused KEY ARGS...: exit 2, the key in the message, no results file
  rm -f bad.h5
  "$lmscale" "${tiny[@]}" "${@:2}" --run.output=bad.h5 >bad.out 2>bad.err
  local rc=$?
  check "$*: exit $rc, expected 2" test "$rc" -eq 2
  check "$*: the message names $1" grep -qF "$1" bad.err
  check "$*: no results file" test ! -e bad.h5
}
refused bench.gemm_precisions "${shape[@]}" --bench.gemm_precisions=bf16   # bf16 needs CUDA
refused bench.gemm_precisions "${shape[@]}" --bench.gemm_precisions=fp9    # not a precision
refused model.d_ff --model.context_length=16 --model.d_ff=88 --bench.gemm_precisions=fp8   # fp8: multiples of 16
refused bench.batch_size --model.context_length=15 --model.d_ff=96 --bench.gemm_precisions=fp8
refused model.moe_experts "${shape[@]}" --model.moe_experts=4

# Strings and units of the file (check_strings.py) and the analysis report's bench-gemm tables
# (need the analysis packages; not checked without them).
if python3 -c "import h5py, pandas, matplotlib" 2>/dev/null; then
  python3 "$repo/ctest/analysis/check_strings.py" gemm.h5 >strings.out 2>&1
  check "every string is UTF-8 and every number has a unit (check_strings.py)" test $? -eq 0
  cat strings.out
  check "/bench_gemm records fp8_fast_accum = forward" python3 -c "
import h5py, sys
v = h5py.File('gemm.h5', 'r')['/bench_gemm'].attrs['fp8_fast_accum']
sys.exit(0 if (v.decode() if isinstance(v, bytes) else str(v)) == 'forward' else 1)"
  (cd "$repo" && python3 -m analysis.report "$outdir/gemm.h5" --out "$outdir/report") >report.out 2>&1
  check "analysis.report exited 0" test $? -eq 0
  check "the report has the block totals" grep -rqF "gemm+casts" "$outdir/report"
else
  echo "note: analysis packages missing, the report is not checked"
fi
[ "$fails" -eq 0 ] && echo "bench-gemm: all checks passed" || echo "bench-gemm: $fails checks failed"
exit $((fails > 0))
