#!/usr/bin/env bash
# data.source = text: inputs/text_quickstart.ini, shortened, must end with a loss (the last
# steps' mean and the evaluation) below the corpus's unigram entropy, which the run stores as
# /train data_unigram_entropy and prints.
# Usage: text_quickstart.sh LMSCALE SOURCE_DIR OUT_DIR STEPS
set -eu
lmscale=$1
src=$2
out=$3
steps=$4
mkdir -p "$out"
cd "$src"
"$lmscale" inputs/text_quickstart.ini --run.output="$out/text_quickstart.h5" --train.steps="$steps" \
  --train.eval_every="$steps" --train.log_every=50 --cost.price_per_gpu_hour=3 | tee "$out/text_quickstart.log"
grep -q "unigram entropy" "$out/text_quickstart.log"
# With a price, the step lines carry the cost to finish beside the ETA; the last one's is 0.
grep -qE "ETA .*cost to finish [0-9.e+-]+ \([0-9.e+-]+ in all\)" "$out/text_quickstart.log"
grep -E "^step +$steps/" "$out/text_quickstart.log" | grep -q "cost to finish 0 "
python3 - "$out/text_quickstart.h5" <<'PY'
import math, sys
import h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
h = float(f["/train"].attrs["data_unigram_entropy"])
# The corpus's byte-frequency entropy, computed here from the file itself.
data = open("inputs/text/training_notes.txt", "rb").read()
train = data[: len(data) - int(len(data) * 0.1)]
counts = np.bincount(np.frombuffer(train, dtype=np.uint8), minlength=256)
p = counts[counts > 0] / len(train)
expect = float(-(p * np.log(p)).sum())
assert abs(h - expect) < 1e-9, (h, expect)
loss = f["/train/steps"]["loss"]
first, last = float(loss[0]), float(np.mean(loss[-10:]))
ev = float(f["/train/eval"]["loss"][-1])
wall, cost = float(f["/train"].attrs["wall_s"]), float(f["/train"].attrs["cost"])
assert abs(cost - wall / 3600 * 3) < 1e-12, (cost, wall)  # one rank x 3 per GPU-hour
print(f"unigram entropy {h:.4f}; loss {first:.4f} -> {last:.4f} (mean of the last 10 steps); eval {ev:.4f}")
assert first > h, "the first loss should be above the unigram entropy (near ln 256)"
assert last < h - 0.1, f"training loss {last:.4f} not below the unigram entropy {h:.4f} - 0.1"
assert ev < h, f"validation loss {ev:.4f} not below the unigram entropy {h:.4f}"
PY
