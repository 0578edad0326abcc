#!/usr/bin/env bash
# moe_bench_balance.sh LMSCALE DECK OUTDIR
# bench-model on an MoE model (tiny_moe.ini, dropless, train steps) in one process and with ep = 2
# on 2 ranks: /bench_model/moe has one row per block and step (warm-up included) with every
# token's k assignments, the two runs' counts are equal (the same global batch), and the routing
# balance attributes are those of the timed rows: the busiest expert's rows over the mean, and the
# busiest ep rank's (its experts together) over the mean rank's (docs/moe.md, docs/hdf5.md).
set -euo pipefail
lmscale=$1 deck=$2 out=$3
mkdir -p "$out"
rm -f "$out"/balance_*.h5
args=(--run.job=bench-model --bench.mode=train-step --bench.warmup=2 --bench.steps=3 --bench.batch_size=8
      --model.moe_capacity_factor=0)
"$lmscale" "$deck" "${args[@]}" --run.output="$out/balance_one.h5" > "$out/balance_one.log" 2>&1 ||
  { cat "$out/balance_one.log"; exit 1; }
mpirun --oversubscribe --allow-run-as-root -np 2 "$lmscale" "$deck" "${args[@]}" --parallel.ep=2 \
  --run.output="$out/balance_ep2.h5" > "$out/balance_ep2.log" 2>&1 || { cat "$out/balance_ep2.log"; exit 1; }
grep -q "moe: the busiest expert got .*the busiest ep rank" "$out/balance_ep2.log" ||
  { echo "the ep run printed no balance line"; cat "$out/balance_ep2.log"; exit 1; }
python3 - "$out" <<'PY'
import sys
import h5py
import numpy as np

out = sys.argv[1]
E, K, LAYERS, TOKENS, WARMUP, STEPS = 4, 2, 2, 8 * 16, 2, 3
tables = {}
for run, ep in (("one", 1), ("ep2", 2)):
    with h5py.File(f"{out}/balance_{run}.h5", "r") as f:
        t = f["/bench_model/moe"][:]
        g = f["bench_model"].attrs
        assert list(t["step"]) == [s for s in range(1, WARMUP + STEPS + 1) for _ in range(LAYERS)], t["step"]
        assert list(t["layer"]) == list(range(LAYERS)) * (WARMUP + STEPS), t["layer"]
        counts = np.stack([t[f"expert_{e}"] for e in range(E)], axis=1).astype(float)
        assert (t["tokens"] == TOKENS).all(), t["tokens"]
        assert (counts.sum(axis=1) == TOKENS * K).all(), counts
        assert (t["dropped_fraction"] == 0).all(), "dropless"
        timed = counts[t["step"] > WARMUP]
        mean = timed.sum(axis=1, keepdims=True) / E
        want_expert = float(np.mean(timed.max(axis=1) / mean[:, 0]))
        per_rank = timed.reshape(len(timed), ep, E // ep).sum(axis=2)
        want_rank = float(np.mean(per_rank.max(axis=1) / (timed.sum(axis=1) / ep)))
        got_expert, got_rank = float(g["moe_expert_rows_max_over_mean"]), float(g["moe_ep_rank_rows_max_over_mean"])
        assert abs(got_expert - want_expert) < 1e-12, (run, got_expert, want_expert)
        assert abs(got_rank - want_rank) < 1e-12, (run, got_rank, want_rank)
        assert got_expert > 1.0, "uneven routing on random tokens"
        assert ep > 1 or got_rank == 1.0, got_rank
        tables[run] = counts
assert (tables["one"] == tables["ep2"]).all(), "ep = 2 routed the global batch differently"
print("moe_bench_balance: /bench_model/moe and the balance attributes are as expected")
PY
