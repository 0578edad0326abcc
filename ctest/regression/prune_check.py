"""Checks of prune_check.sh's files (see there)."""
import sys

import h5py
import numpy as np

out = sys.argv[1]
PRUNED = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.output_proj", "ffn.w1", "ffn.w2", "ffn.w3")


def weights(path):
    with h5py.File(path, "r") as f:
        return {k: f[k][()] for k in f if isinstance(f[k], h5py.Dataset)}


w = weights(f"{out}/w.h5")
# (1) unstructured: exact sparsity, counted.
u = weights(f"{out}/u_w.h5")
assert u.keys() == w.keys()
n = zeros = 0
for k, v in u.items():
    assert v.shape == w[k].shape, k
    if k.startswith("layers.") and any(p in k for p in PRUNED):
        n += v.size
        zeros += int((v == 0).sum())
    else:  # embedding, head, norms: fine-tuned but never pruned
        assert (v != 0).all(), k
target = round(0.75 * n)
print(f"unstructured: {zeros} zeros of {n} pruned-set weights, target {target}")
assert zeros == target, (zeros, target)
with h5py.File(f"{out}/u.h5", "r") as f:
    rounds = f["/prune/rounds"][()]
    assert abs(f["/prune"].attrs["final_sparsity"] - target / n) < 1e-12
    assert rounds["round"].tolist() == list(range(len(rounds)))
    assert np.all(np.diff(rounds["kept"]) < 0), rounds["kept"]
    assert np.all(np.isfinite(rounds["val_loss"]))

# (2) structured: export == masked, physically smaller.
s = weights(f"{out}/s_w.h5")
assert s["layers.0.ffn.w1.weight"].shape == (32, 32), s["layers.0.ffn.w1.weight"].shape
assert s["layers.1.ffn.w2.weight"].shape == (32, 32)
assert s["token_embeddings.weight"].shape == w["token_embeddings.weight"].shape
with h5py.File(f"{out}/s_w.h5", "r") as f:
    assert int(f.attrs["d_ff"]) == 32
with h5py.File(f"{out}/s.h5", "r") as f:
    r = f["/prune/rounds"][()]
    for row in r[1:]:
        rel = abs(row["export_val_loss"] - row["val_loss"]) / row["val_loss"]
        print(f"structured round {row['round']}: d_ff {row['d_ff']}, masked {row['val_loss']:.7f}, "
              f"export {row['export_val_loss']:.7f} (rel {rel:.1e}), forward {row['forward_ms']:.3f} -> "
              f"{row['export_forward_ms']:.3f} ms")
        assert rel < 1e-5, rel
    assert r["d_ff"][-1] == 32

# (4) two ranks (DDP; pipeline stages) give the one-process rounds.
for name in ("s_np2ddp=bucketed", "s_np2pp=2"):
    with h5py.File(f"{out}/{name}.h5", "r") as f:
        r2 = f["/prune/rounds"][()]
    rel = np.abs(r2["val_loss"] - r["val_loss"]) / r["val_loss"]
    print(f"{name}: val losses {np.round(r2['val_loss'], 7).tolist()}, max rel to one process {rel.max():.1e}")
    assert rel.max() < 1e-5, rel
    assert (r2["d_ff"] == r["d_ff"]).all()

# (3) loss-guided: the kept round is within the bound; a later round went above it (or the target
# was reached).
with h5py.File(f"{out}/g.h5", "r") as f:
    g = f["/prune/rounds"][()]
    bound = f["/prune"].attrs["loss_bound"]
    final = int(f["/prune"].attrs["final_round"])
    print(f"loss-guided: bound {bound:.4f}, final round {final}, losses {np.round(g['val_loss'], 4).tolist()}")
    assert g["val_loss"][final] <= bound
    assert all(g["accepted"][: final + 1] == 1)
    if final + 1 < len(g):
        assert g["val_loss"][final + 1] > bound and g["accepted"][final + 1] == 0
print("prune checks passed")
