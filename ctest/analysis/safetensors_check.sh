#!/usr/bin/env bash
# ctest analysis.safetensors: safetensors_check.sh LMSCALE OUTDIR
# Weights in safetensors (train.save / prune.weights / prune.output ending in .safetensors) checked
# against a float64 NumPy reference of the CS336 Transformer LM (analysis/reference_lm.py), which
# loads them with the `safetensors` package:
#   - train one step with lr 1e-30 on a token file of context_length + 2 tokens (every row, train
#     and held-out, is its first context_length + 1 tokens): the saved weights are the initial ones
#     and the logged step-1 loss must equal the reference's loss of that row within 1e-4;
#   - the file holds exactly the CS336 parameter names and shapes;
#   - prune (unstructured, then structured) reads that file and writes .safetensors: its round-0
#     validation loss must be the reference's loss of the input file, and the reference's loss of
#     the output file must be the accepted round's loss (the smaller model's, structured).
# Exit 77 (skipped) without numpy or safetensors, unless LMSCALE_REQUIRE_ANALYSIS is set.
set -euo pipefail
lmscale=$1 outdir=$2
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
if ! "$py" -c "import numpy, safetensors, h5py" 2>/dev/null; then
  if [ -n "${LMSCALE_REQUIRE_ANALYSIS:-}" ]; then
    echo "FAIL: numpy, safetensors or h5py missing (LMSCALE_REQUIRE_ANALYSIS is set)"; exit 1
  fi
  echo "SKIP: numpy, safetensors or h5py missing; install analysis/requirements.txt (make deps)"; exit 77
fi
rm -rf "$outdir"
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
cd "$repo"
deck=ctest/regression/tiny_train.ini
data=(--data.source=tokens --data.path="$outdir/tokens.u16")
"$py" -c "import numpy as np; np.random.default_rng(5).integers(0, 97, 18).astype(np.uint16).tofile('$outdir/tokens.u16')"
set -x
"$lmscale" "$deck" "${data[@]}" --run.output="$outdir/train.h5" --train.steps=1 --train.log_every=1 \
  --train.eval_every=0 --train.batch_size=2 --optim.lr=1e-30 --optim.min_lr=1e-30 --optim.warmup_steps=0 \
  --train.save="$outdir/weights.safetensors" > "$outdir/train.log"
prune=(--run.job=prune --prune.weights="$outdir/weights.safetensors" --prune.theta=2 --prune.target_sparsity=0.5
       --prune.finetune_steps=1 --train.eval_batches=1 --train.batch_size=2)
"$lmscale" "$deck" "${data[@]}" "${prune[@]}" --prune.output="$outdir/pruned.safetensors" \
  --run.output="$outdir/prune.h5" > "$outdir/prune.log"
"$lmscale" "$deck" "${data[@]}" "${prune[@]}" --prune.method=structured --prune.output="$outdir/pruned_ffn.safetensors" \
  --run.output="$outdir/prune_ffn.h5" > "$outdir/prune_ffn.log"
set +x
PYTHONPATH="$repo" "$py" - "$outdir" <<'PY'
import sys
import h5py
import numpy as np
from safetensors.numpy import load_file
from analysis import reference_lm

out = sys.argv[1]
rows = np.fromfile(f"{out}/tokens.u16", dtype=np.uint16).astype(np.int64)[:17].reshape(1, 17)
failures = []


def check(what, got, want, tol=1e-4):
    ok = abs(got - want) <= tol
    print(f"{'ok  ' if ok else 'FAIL'} {what}: lmscale {want:.9f}, reference {got:.9f}, |diff| {abs(got - want):.2e}")
    if not ok:
        failures.append(what)


def reference(path):
    weights, meta = reference_lm.load_weights(path)
    heads, theta, eps = reference_lm.model_keys(meta)
    return reference_lm.loss(weights, rows, heads, theta, eps)


names = load_file(f"{out}/weights.safetensors")
want = {"token_embeddings.weight": (97, 32), "ln_final.weight": (32,), "lm_head.weight": (97, 32)}
for i in range(2):
    for n in ("q", "k", "v", "output"):
        want[f"layers.{i}.attn.{n}_proj.weight"] = (32, 32)
    want.update({f"layers.{i}.ln1.weight": (32,), f"layers.{i}.ln2.weight": (32,), f"layers.{i}.ffn.w1.weight": (88, 32),
                 f"layers.{i}.ffn.w2.weight": (32, 88), f"layers.{i}.ffn.w3.weight": (88, 32)})
got = {k: tuple(v.shape) for k, v in names.items()}
if got != want:
    failures.append(f"parameter names and shapes: {sorted(set(got.items()) ^ set(want.items()))}")
print(f"{'ok  ' if got == want else 'FAIL'} CS336 names and shapes ({len(got)} tensors, float32: "
      f"{all(v.dtype == np.float32 for v in names.values())})")

with h5py.File(f"{out}/train.h5", "r") as f:
    step1 = f["/train/steps"][0]
    if int(step1["step"]) != 1:
        failures.append(f"/train/steps counts from {int(step1['step'])}, not 1")
    check("train.save: step-1 loss", reference(f"{out}/weights.safetensors"), float(step1["loss"]))
for stem, output, column in (("prune", "pruned", "val_loss"), ("prune_ffn", "pruned_ffn", "export_val_loss")):
    with h5py.File(f"{out}/{stem}.h5", "r") as f:
        rounds = f["/prune/rounds"][()]
        final = int(f["/prune"].attrs["final_round"])
        check(f"{stem}: prune.weights, round 0", reference(f"{out}/weights.safetensors"), float(rounds["val_loss"][0]))
        accepted = rounds[rounds["round"] == final][0]
        check(f"{stem}: prune.output, round {final} {column}", reference(f"{out}/{output}.safetensors"),
              float(accepted[column]))
sys.exit(1 if failures else 0)
PY
