#!/usr/bin/env bash
# moe_study_check.sh LMSCALE REPO OUTDIR
# The mixture-of-experts study of docs/moe.md end to end: inputs/moe_text.ini and its dense twin of
# equal active FLOPs on inputs/text (CPU, about 30 s), then analysis.moe_study, which draws both
# loss curves in one figure and exits 1 unless the MoE model's validation loss ends below the
# dense model's.
set -euo pipefail
lmscale=$1 repo=$2 out=$3
mkdir -p "$out"
cd "$repo"
python3 -c "import h5py, matplotlib, pandas" 2>/dev/null || { echo "h5py/matplotlib/pandas missing: skipped"; exit 77; }
rm -f "$out"/moe_text*.h5
"$lmscale" inputs/moe_text.ini --run.output="$out/moe_text.h5" --run.progress=false
"$lmscale" inputs/moe_text_dense.ini --run.output="$out/moe_text_dense.h5" --run.progress=false
python3 -m analysis.moe_study "$out/moe_text.h5" "$out/moe_text_dense.h5" --out "$out/study"
test -s "$out/study/loss.png" && test -s "$out/study/balance.png"
