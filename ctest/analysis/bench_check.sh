#!/usr/bin/env bash
# ctest analysis.bench_table / analysis.bench_peer: bench_check.sh LMSCALE OUTDIR table|peer
#   table: two tiny CPU bench-model runs of inputs/bench_model_small_cpu.ini and two fake peer JSON
#          files go through bench/ratio_table.py; the table's rows must hold the medians and ratio
#          computed here from the files (needs h5py).
#   peer:  bench/torch_peer.py model on CPU at a tiny shape prints its JSON object; then lmscale
#          trains one step (lr 1e-30: the saved weights are the initial ones) on a token file of
#          context_length + 2 tokens (every row is its first context_length + 1 tokens) and
#          `torch_peer.py check` must give lmscale's logged step-1 loss within 1e-5 (needs torch).
# Exit 77 (skipped) when the Python packages are missing, unless LMSCALE_REQUIRE_ANALYSIS (table)
# or LMSCALE_REQUIRE_TORCH (peer) is set.
set -euo pipefail
lmscale=$1 outdir=$2 part=$3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
skip() {
  if [ -n "${!1:-}" ]; then echo "FAIL: $2 ($1 is set)"; exit 1; fi
  echo "SKIP: $2"; exit 77
}
tiny=(--model.size=custom --model.vocab_size=97 --model.context_length=16 --model.d_model=32 --model.d_ff=88
      --model.num_layers=2 --model.num_heads=4)
rm -rf "$outdir"
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
cd "$repo"

if [ "$part" = table ]; then
  "$py" -c "import h5py, numpy" 2>/dev/null || skip LMSCALE_REQUIRE_ANALYSIS "h5py or numpy missing (pip install -r bench/requirements.txt)"
  for i in 1 2; do
    "$lmscale" inputs/bench_model_small_cpu.ini "${tiny[@]}" --bench.warmup=1 --bench.steps=3 \
      --run.output="$outdir/lmscale_$i.h5" > "$outdir/lmscale_$i.log"
  done
  # the peer's lines as torchrun leaves them: a log line, then the JSON object
  printf 'W1126 torchrun warning\n{"peer": "torch", "mode": "model", "step_ms": 2.0, "peak_gib": 0.5}\n' > "$outdir/peer_1.jsonl"
  printf '{"peer": "torch", "mode": "model", "step_ms": 4.0, "peak_gib": 0.5}\n' > "$outdir/peer_2.jsonl"
  "$py" bench/ratio_table.py --title tiny \
    --row "tiny: step" ms "$outdir/lmscale_*.h5::/bench_model@total_ms_median" "$outdir/peer_*.jsonl::step_ms::mode=model" \
    --row "tiny: peak memory" GiB "$outdir/lmscale_*.h5::/bench_model@peak_bytes" "$outdir/peer_*.jsonl::peak_gib" \
    --row "tiny: absent" ms "$outdir/none_*.h5::/bench_model@total_ms_median" "$outdir/peer_*.jsonl::step_ms::mode=ddp" \
    | tee "$outdir/table.md"
  "$py" - "$outdir" <<'PY'
import glob, statistics, sys
import h5py
out = sys.argv[1]
files = sorted(glob.glob(f"{out}/lmscale_*.h5"))
ms = statistics.median(float(h5py.File(f)["/bench_model"].attrs["total_ms_median"]) for f in files)
# The period (wall clock from one step's start to the next's) holds the step: never shorter, and
# the wall-clock tokens/s never above the step's.
for f in files:
    a = h5py.File(f)["/bench_model"].attrs
    for stat in ("min", "median", "max"):
        assert a[f"period_ms_{stat}"] >= a[f"total_ms_{stat}"] > 0, (f, stat, a[f"period_ms_{stat}"], a[f"total_ms_{stat}"])
    assert 0 < a["tokens_per_s_wall"] <= a["tokens_per_s"], (f, a["tokens_per_s_wall"], a["tokens_per_s"])
gib = statistics.median(float(h5py.File(f)["/bench_model"].attrs["peak_bytes"]) for f in files) / 2**30
rows = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]] for l in open(f"{out}/table.md") if l.startswith("| tiny")}
unit, lm, peer, ratio, runs = rows["tiny: step"]
assert unit == "ms" and runs == "2/2, 2/2", rows
assert abs(float(lm) - ms) <= 1e-3 * ms + 1e-4, (lm, ms)
assert float(peer) == 3.0, peer                       # median of 2.0 and 4.0
assert abs(float(ratio) - ms / 3.0) <= 2e-3 * ms / 3.0 + 1e-4, (ratio, ms)
unit, lm, peer, ratio, runs = rows["tiny: peak memory"]
assert unit == "GiB" and abs(float(lm) - gib) <= 1e-3 * gib and float(peer) == 0.5, rows
assert rows["tiny: absent"][1:] == ["-", "-", "-", "0/0, 0/2"], rows["tiny: absent"]
print(f"ratio table ok: lmscale {ms:.4f} ms, peer 3 ms")
PY
  exit 0
fi

"$py" -c "import torch, h5py, numpy" 2>/dev/null || skip LMSCALE_REQUIRE_TORCH "torch, h5py or numpy missing (pip install -r bench/requirements.txt)"
shape=(--d-model 32 --d-ff 88 --layers 2 --heads 4 --vocab 97 --seq 16 --batch 2)
"$py" bench/torch_peer.py model --device cpu "${shape[@]}" --warmup 1 --iters 2 | tee "$outdir/peer_model.jsonl"
"$py" - "$outdir/peer_model.jsonl" <<'PY'
import json, sys
rec = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
assert rec["mode"] == "model" and rec["d_model"] == 32 and rec["seq"] == 16, rec
assert rec["step_ms"] > 0 and rec["forward_ms"] > 0 and rec["tokens_per_s"] > 0, rec
PY
"$py" bench/torch_peer.py model --device cpu "${shape[@]}" --warmup 1 --iters 2 --step-only > "$outdir/peer_step_only.jsonl"
"$py" - "$outdir/peer_step_only.jsonl" <<'PY'
import json, sys
rec = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
assert rec["forward_ms"] is None and rec["step_ms"] > 0, rec
PY
"$py" -c "import numpy as np; np.random.default_rng(5).integers(0, 97, 18).astype(np.uint16).tofile('$outdir/tokens.u16')"
"$lmscale" ctest/regression/tiny_train.ini --run.output="$outdir/train.h5" --train.steps=1 --train.log_every=1 \
  --train.eval_every=0 --train.batch_size=2 --optim.lr=1e-30 --optim.min_lr=1e-30 --optim.warmup_steps=0 \
  --data.source=tokens --data.path="$outdir/tokens.u16" --train.save="$outdir/weights.h5" > "$outdir/train.log"
"$py" bench/torch_peer.py check --weights "$outdir/weights.h5" --tokens "$outdir/tokens.u16" | tee "$outdir/check.jsonl"
"$py" - "$outdir" <<'PY'
import json, sys
import h5py
out = sys.argv[1]
peer = json.loads(open(f"{out}/check.jsonl").read().strip().splitlines()[-1])
logged = float(h5py.File(f"{out}/train.h5")["/train/steps"]["loss"][0])
assert peer["rows"] == 1 and peer["seq"] == 16, peer
diff = abs(peer["loss"] - logged)
print(f"lmscale step-1 loss {logged:.9f}, torch float64 {peer['loss']:.9f}, |diff| {diff:.2e}")
assert diff < 1e-5, diff
PY
