#!/usr/bin/env bash
# Study: FP8 training (precision.mode = fp8, docs/precision.md "The FP8 study") on one Hopper GPU:
#   - convergence: inputs/fp8_text.ini (a small model on inputs/text, 2000 steps) in bf16, fp8
#     with current scaling and fp8 with delayed scaling, once each (same data, tokens and seed);
#     analysis.fp8_study draws the three loss curves in one figure ($OUT/study/loss.png) and
#     prints the final losses and their ratios to bf16 (exit 1 when an fp8 run ends more than 2%
#     above bf16);
#   - convergence at scale: inputs/fp8_xl_text.ini (xl with a byte vocabulary, 300 steps) in bf16
#     and in fp8 with current scaling; analysis.fp8_study draws both curves ($OUT/study_xl/loss.png)
#     and exits 1 when fp8 ends more than 1.5% above bf16;
#   - speed: xl (inputs/bench_model_xl_bf16.ini, flash attention, 4 x 512 tokens, train step) in
#     bf16 and in fp8, eager and as a captured CUDA graph (train.cuda_graphs), and fp8 with delayed
#     scaling under graphs (also with precision.fp8_fast_accum = all, the weights cast by the
#     optimizer step and by each forward), REPEATS times in alternation; the median step and
#     tokens/s of each and their ratio.
# With PEER_FP8=1 the timing also runs the PyTorch peer's xl in bf16 (torch.compile of the whole
# model, and of each block on its own) and with torchao's float8 training (bench/torch_peer.py model
# --float8, tensorwise dynamic scaling: the peer of current scaling; needs torch and torchao) under
# per-block compilation (--compile-blocks: the whole model in float8 did not finish compiling in
# 400 s on an H100), and prints their ratio table.
#   bench/study_fp8.sh   (SKIP_TEXT=1, SKIP_XL_TEXT=1, SKIP_XL=1 leave a part out; PEER_FP8=1)
STUDY=fp8
source "$(dirname "$0")/common.sh"
if [ -z "$DRY_RUN" ]; then
  if [ ! -x "$LMSCALE" ]; then say "no lmscale at $LMSCALE (build it, or set LMSCALE)"; exit 2; fi
  if ! "$PYTHON" -c "import h5py, pandas, matplotlib" 2>/dev/null; then
    say "$PYTHON lacks h5py, pandas or matplotlib: pip install -r analysis/requirements.txt"; exit 2
  fi
fi
XL=(inputs/bench_model_xl_bf16.ini --model.attention=flash)
PEER_FP8=${PEER_FP8:-}
PEER_XL=(model --size xl --precision bf16 --attention sdpa --step-only --warmup 5 --iters 10)   # the deck's shape and steps; the train step only (one compilation)
if [ -n "$PEER_FP8" ] && [ -z "${SKIP_XL:-}" ]; then preflight 1; fi

if [ -z "${SKIP_TEXT:-}" ]; then
  RUN=1
  lm text_bf16 1 inputs/fp8_text.ini
  lm text_fp8_current 1 inputs/fp8_text.ini --precision.mode=fp8
  lm text_fp8_delayed 1 inputs/fp8_text.ini --precision.mode=fp8 --precision.fp8_scaling=delayed
fi
if [ -z "${SKIP_XL_TEXT:-}" ]; then
  RUN=1
  lm xl_text_bf16 1 inputs/fp8_xl_text.ini
  lm xl_text_fp8_current 1 inputs/fp8_xl_text.ini --precision.mode=fp8
  xl_study=("$PYTHON" -m analysis.fp8_study "$OUT/xl_text_bf16/lmscale_1.h5" "$OUT/xl_text_fp8_current/lmscale_1.h5"
            --out "$OUT/study_xl" --max-ratio 1.015 --title "xl, 300 steps: bf16 against FP8 (current scaling)")
  if [ -n "$DRY_RUN" ]; then echo "${xl_study[*]}"; else "${xl_study[@]}" || say "xl: fp8 ended more than 1.5% above bf16 (or a run failed)"; fi
fi
RUN=0
timing() {
  lm xl_bf16 1 "${XL[@]}"
  lm xl_fp8 1 "${XL[@]}" --precision.mode=fp8
  lm xl_bf16_graphs 1 "${XL[@]}" --train.cuda_graphs=true
  lm xl_fp8_graphs 1 "${XL[@]}" --precision.mode=fp8 --train.cuda_graphs=true
  lm xl_fp8_delayed_graphs 1 "${XL[@]}" --precision.mode=fp8 --precision.fp8_scaling=delayed --train.cuda_graphs=true
  # Fast accumulation everywhere, with the weights cast by the optimizer step (the default) and by
  # each forward (docs/precision.md, "Weights cast by the optimizer step").
  lm xl_fp8_delayed_all_graphs 1 "${XL[@]}" --precision.mode=fp8 --precision.fp8_scaling=delayed \
    --precision.fp8_fast_accum=all --train.cuda_graphs=true
  lm xl_fp8_delayed_all_forward_casts_graphs 1 "${XL[@]}" --precision.mode=fp8 --precision.fp8_scaling=delayed \
    --precision.fp8_fast_accum=all --precision.fp8_weight_casts=forward --train.cuda_graphs=true
  if [ -n "$PEER_FP8" ]; then
    peer xl_peer_bf16 1 "${PEER_XL[@]}" --compile
    peer xl_peer_bf16_blocks 1 "${PEER_XL[@]}" --compile-blocks
    peer xl_peer_float8 1 "${PEER_XL[@]}" --compile-blocks --float8
  fi
}
[ -n "${SKIP_XL:-}" ] || repeat timing

args=()
if [ -z "${SKIP_XL:-}" ]; then
  args+=(--xl-bf16 "$OUT"/xl_bf16/lmscale_*.h5 --xl-fp8 "$OUT"/xl_fp8/lmscale_*.h5)
fi
if [ -z "${SKIP_TEXT:-}" ]; then
  study=("$PYTHON" -m analysis.fp8_study "$OUT/text_bf16/lmscale_1.h5" "$OUT/text_fp8_current/lmscale_1.h5"
         "$OUT/text_fp8_delayed/lmscale_1.h5" --out "$OUT/study" "${args[@]}")
  if [ -n "$DRY_RUN" ]; then echo "${study[*]}"; else "${study[@]}"; fi
fi
if [ -z "${SKIP_XL:-}" ] && [ -z "$DRY_RUN" ]; then
  # The xl timings, eager and under CUDA graphs: median step and tokens/s of each case.
  "$PYTHON" - "$OUT" <<'PY'
import glob, statistics, sys
import h5py
out = sys.argv[1]
def median(case, key):
    v = [float(h5py.File(f, "r")["bench_model"].attrs[key]) for f in sorted(glob.glob(f"{out}/{case}/lmscale_*.h5"))]
    return statistics.median(v) if v else float("nan")
print("| xl train step | bf16 | fp8 current | fp8 / bf16 (tokens/s) |")
print("| --- | ---: | ---: | ---: |")
for label, suffix in (("eager", ""), ("CUDA graphs", "_graphs")):
    b, f = median("xl_bf16" + suffix, "tokens_per_s"), median("xl_fp8" + suffix, "tokens_per_s")
    bm, fm = median("xl_bf16" + suffix, "total_ms_median"), median("xl_fp8" + suffix, "total_ms_median")
    print(f"| {label} | {bm:.2f} ms, {b:.0f} tokens/s | {fm:.2f} ms, {f:.0f} tokens/s | {f / b:.3f} |")
# Delayed scaling under CUDA graphs (SwiGLU's casts fused: docs/precision.md).
b, d = median("xl_bf16_graphs", "tokens_per_s"), median("xl_fp8_delayed_graphs", "tokens_per_s")
dm = median("xl_fp8_delayed_graphs", "total_ms_median")
print(f"| CUDA graphs, fp8 delayed scaling | | {dm:.2f} ms, {d:.0f} tokens/s | {d / b:.3f} |")
for label, case in (("fast_accum = all", "xl_fp8_delayed_all_graphs"),
                    ("fast_accum = all, weights cast by each forward", "xl_fp8_delayed_all_forward_casts_graphs")):
    d, dm = median(case, "tokens_per_s"), median(case, "total_ms_median")
    print(f"| CUDA graphs, fp8 delayed scaling, {label} | | {dm:.2f} ms, {d:.0f} tokens/s | {d / b:.3f} |")
PY
fi
if [ -n "$PEER_FP8" ] && [ -z "${SKIP_XL:-}" ]; then
  step_rows "xl bf16, flash vs SDPA" xl_bf16 xl_peer_bf16
  step_rows "xl bf16, flash vs SDPA, per-block compilation" xl_bf16 xl_peer_bf16_blocks
  step_rows "xl fp8 current vs torchao float8 (SDPA, per-block compilation)" xl_fp8 xl_peer_float8
  print_table "xl on 1 GPU, batch 4 x 512, train step, bf16 and FP8"
fi
