"""ep_check.sh's comparison: an expert-parallel run against one process (docs/moe.md).

ep_check.py REF RUN [TOL [COUNT_TOL]]: every logged step of RUN (a resumed run logs only its own steps) has
the loss and the gradient norm of REF's same step within TOL (default 1e-6, fp32), and (for runs from step 1)
/train/moe's assignments per expert, tokens and dropped fractions are REF's exactly (routing is decided per
sequence, whatever rank holds the experts). COUNT_TOL > 0 (mixed precision, where rounding can move a
token whose router probabilities nearly tie to another expert): tokens still equal, the assignments per
expert and the dropped fractions within COUNT_TOL x the row's assignments.
ep_check.py --weights A B [TOL]: two weights files hold the same parameters within TOL.
"""
import sys

import h5py
import numpy as np


def steps(path):
    with h5py.File(path, "r") as f:
        t = f["/train/steps"][:]
        moe = f["/train/moe"][:] if "/train/moe" in f else None
    return t, moe


def compare_runs(ref, run, tol, count_tol=0.0):
    a, ma = steps(ref)
    b, mb = steps(run)
    loss = {int(s): float(l) for s, l in zip(a["step"], a["loss"])}
    assert len(b) > 0, f"{run}: no steps"
    worst = max(abs(loss[int(s)] - float(l)) for s, l in zip(b["step"], b["loss"]))
    assert worst <= tol, f"{run}: loss differs from {ref} by {worst:.3g} > {tol}"
    # The gradient norm counts every expert parameter once (and each dense one once).
    norm = {int(s): float(g) for s, g in zip(a["step"], a["grad_norm"])}
    worst_norm = max(abs(norm[int(s)] - float(g)) for s, g in zip(b["step"], b["grad_norm"]))
    assert worst_norm <= tol, f"{run}: grad_norm differs from {ref} by {worst_norm:.3g} > {tol}"
    # Evaluations (train.eval_every) where RUN has them: REF's losses of the same steps within TOL.
    with h5py.File(ref, "r") as fa, h5py.File(run, "r") as fb:
        eb = fb["/train/eval"][:] if "/train/eval" in fb else []
        if len(eb) > 0:
            ea = {int(s): float(l) for s, l in zip(fa["/train/eval"]["step"], fa["/train/eval"]["loss"])}
            assert all(int(s) in ea for s in eb["step"]), f"{run}: evaluations at {eb['step']}, {ref} at {list(ea)}"
            worst_eval = max(abs(ea[int(s)] - float(l)) for s, l in zip(eb["step"], eb["loss"]))
            print(f"ep_check.py: {run}: {len(eb)} evaluations, max difference {worst_eval:.3g}")
            assert worst_eval <= tol, f"{run}: evaluation loss differs from {ref} by {worst_eval:.3g} > {tol}"
    # /train/moe rows count since the previous logged row: a resumed run's first row covers fewer
    # steps than REF's row of the same step, so only runs from step 1 compare their counts.
    if ma is not None and int(b["step"][0]) == 1:
        keep = np.isin(ma["step"], mb["step"])
        ra = ma[keep]
        assert len(ra) == len(mb), f"{run}: {len(mb)} /train/moe rows, {ref} has {len(ra)} at those steps"
        experts = [c for c in ma.dtype.names if c.startswith("expert_")]
        for c in ["tokens", "layer", "step"] + (experts if count_tol == 0 else []):
            assert (ra[c] == mb[c]).all(), f"{run}: /train/moe {c} differs from {ref}: {ra[c]} vs {mb[c]}"
        if count_tol > 0:
            assignments = sum(ra[c].astype(np.int64) for c in experts)
            for c in experts:
                moved = np.abs(ra[c].astype(np.int64) - mb[c].astype(np.int64))
                assert (moved <= count_tol * assignments).all(), \
                    f"{run}: /train/moe {c} differs from {ref} by more than {count_tol} of the assignments: {ra[c]} vs {mb[c]}"
        assert np.allclose(ra["dropped_fraction"], mb["dropped_fraction"], rtol=0, atol=max(count_tol, 1e-12)), \
            f"{run}: dropped_fraction {mb['dropped_fraction']} vs {ref}'s {ra['dropped_fraction']}"
    print(f"ep_check.py: {run} matches {ref} (max loss difference {worst:.3g}, {len(b)} steps)")


def compare_weights(a_path, b_path, tol):
    worst = 0.0
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        names = []
        a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        assert any("experts.w1" in n for n in names), names
        for n in names:
            assert a[n].shape == b[n].shape, n
            worst = max(worst, float(np.abs(a[n][...] - b[n][...]).max(initial=0)))
    assert worst <= tol, f"{b_path}: weights differ from {a_path} by {worst:.3g} > {tol}"
    print(f"ep_check.py: {b_path} holds {a_path}'s weights (max difference {worst:.3g})")


if __name__ == "__main__":
    if sys.argv[1] == "--weights":
        compare_weights(sys.argv[2], sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 1e-6)
    else:
        compare_runs(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 1e-6,
                     float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
