"""Checks of moe_check.sh's files (see there): /train/moe and the weights file."""
import sys

import h5py
import numpy as np

out = sys.argv[1]
E, K, LAYERS, TOKENS_PER_STEP = 4, 2, 2, 8 * 16
LOG_STEPS = [1, 3, 6, 9, 12]   # the first step, every log_every = 3, the last

with h5py.File(f"{out}/moe_one.h5", "r") as f:
    t = f["/train/moe"][:]
    assert list(t["step"]) == [s for s in LOG_STEPS for _ in range(LAYERS)], t["step"]
    assert list(t["layer"]) == list(range(LAYERS)) * len(LOG_STEPS)
    steps_since = np.diff([0] + LOG_STEPS)
    for i, row in enumerate(t):
        n = steps_since[i // LAYERS]
        assert row["tokens"] == n * TOKENS_PER_STEP, row
        routed = sum(int(row[f"expert_{e}"]) for e in range(E))
        assert routed == n * TOKENS_PER_STEP * K, row   # every token's k choices, before the capacity
        assert 0 <= row["dropped_fraction"] < 1, row
        assert row["balance_loss"] >= 1 - 1e-6, row      # 1 at perfect balance, more otherwise
    assert t["dropped_fraction"].max() > 0, "capacity factor 1 drops some assignments"
    assert f["/train"].attrs["parameters_active"] < f["/train"].attrs["parameters"]
    units = dict(zip([n for n in t.dtype.names], [u.decode() if isinstance(u, bytes) else u
                                                  for u in f["/train/moe"].attrs["units"]]))
    assert units["expert_0"] == "assignments", units

# The data-parallel run sums its ranks' counts: the same table as one process's.
with h5py.File(f"{out}/moe_one.h5", "r") as a, h5py.File(f"{out}/moe_ddp.h5", "r") as b:
    ta, tb = a["/train/moe"][:], b["/train/moe"][:]
    for e in range(E):
        assert (ta[f"expert_{e}"] == tb[f"expert_{e}"]).all(), e
    assert np.allclose(ta["dropped_fraction"], tb["dropped_fraction"])
    assert np.allclose(ta["balance_loss"], tb["balance_loss"], rtol=1e-5)

with h5py.File(f"{out}/moe_weights.h5", "r") as w:
    for l in range(LAYERS):
        assert w[f"layers.{l}.ffn.router.weight"].shape == (E, 32)
        assert w[f"layers.{l}.ffn.experts.w1.weight"].shape == (E, 24, 32)
        assert w[f"layers.{l}.ffn.experts.w2.weight"].shape == (E, 32, 24)
        assert w[f"layers.{l}.ffn.experts.w3.weight"].shape == (E, 24, 32)
        assert f"layers.{l}.ffn.w1.weight" not in w
print("moe_check.py: /train/moe and the weights file are as expected")
