"""ep_rebalance_check.sh's comparisons: runs whose experts were relabelled (parallel.ep_rebalance_every,
docs/moe.md "Rebalancing the ep ranks") against one process, which never relabels.

ep_rebalance_check.py losses REF RUN [TOL [COUNT_TOL]]: RUN's losses and gradient norms within TOL (default
1e-6) of REF's same steps; RUN's /train/moe rows are REF's with the experts relabelled: the count of label e
equals REF's count of expert origin[e] (within COUNT_TOL x the row's assignments when given: mixed precision),
origin being the labels in force during that step (/train/ep_placement's last row for the block at an
earlier step); and at least one expert moved.
ep_rebalance_check.py weights REF_WEIGHTS RUN_WEIGHTS RUN_H5 [TOL]: RUN's final weights are REF's with
each MoE block's expert slices and router rows taken in RUN's final origin order.
"""
import sys

import h5py
import numpy as np


def origins(path):
    """{layer: [(step, origin list)]} from /train/ep_placement, in step order."""
    with h5py.File(path, "r") as f:
        t = f["/train/ep_placement"][:]
    cols = sorted((c for c in t.dtype.names if c.startswith("origin_")), key=lambda c: int(c.split("_")[1]))
    out = {}
    for row in t:
        out.setdefault(int(row["layer"]), []).append((int(row["step"]), [int(row[c]) for c in cols]))
    moved = int(t["moved"].sum())
    return out, moved, len(cols)


def origin_at(table, layer, step, experts):
    """The labels in force during `step`: the last relabelling after a step before it."""
    current = list(range(experts))
    for s, o in table.get(layer, []):
        if s < step:
            current = o
    return current


def losses(ref, run, tol, count_tol=0.0):
    with h5py.File(ref, "r") as a, h5py.File(run, "r") as b:
        sa, sb = a["/train/steps"][:], b["/train/steps"][:]
        ma, mb = a["/train/moe"][:], b["/train/moe"][:]
    loss = {int(s): float(l) for s, l in zip(sa["step"], sa["loss"])}
    norm = {int(s): float(g) for s, g in zip(sa["step"], sa["grad_norm"])}
    worst = max(abs(loss[int(s)] - float(l)) for s, l in zip(sb["step"], sb["loss"]))
    worst_norm = max(abs(norm[int(s)] - float(g)) for s, g in zip(sb["step"], sb["grad_norm"]))
    assert worst <= tol and worst_norm <= tol, \
        f"{run}: loss / grad_norm differ from {ref} by {worst:.3g} / {worst_norm:.3g} > {tol}"
    table, moved, experts = origins(run)
    assert moved > 0, f"{run}: /train/ep_placement moved no expert: the relabelling was not exercised"
    names = [f"expert_{e}" for e in range(experts)]
    compared = 0
    if int(sb["step"][0]) == 1:
        # RUN records at every relabelling step too, so its rows cover shorter windows than REF's:
        # its rows up to each of REF's are summed per expert (label e -> expert origin[e]).
        for layer in sorted(set(int(x) for x in ma["layer"])):
            ref_rows = sorted((r for r in ma if int(r["layer"]) == layer), key=lambda r: int(r["step"]))
            sums = {int(r["step"]): [0] * experts for r in ref_rows}
            for r in mb[mb["layer"] == layer]:
                step = int(r["step"])
                window = min(s for s in sums if s >= step)
                o = origin_at(table, layer, step, experts)
                for e in range(experts):
                    sums[window][o[e]] += int(r[names[e]])
            for r in ref_rows:
                want = [int(r[n]) for n in names]
                got = sums[int(r["step"])]
                slack = count_tol * sum(want)
                assert all(abs(g - w) <= slack for g, w in zip(got, want)), \
                    f"{run}: layer {layer} up to step {int(r['step'])}: counts per expert {got}, {ref}'s {want}"
                compared += 1
    print(f"ep_rebalance_check.py: {run} matches {ref} (max loss difference {worst:.3g}, {moved} experts moved, "
          f"{compared} /train/moe rows compared)")


def weights(ref_w, run_w, run_h5, tol):
    table, _, experts = origins(run_h5)
    worst = 0.0
    with h5py.File(ref_w, "r") as a, h5py.File(run_w, "r") as b:
        names = []
        a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        relabelled = 0
        for n in names:
            x, y = a[n][...], b[n][...]
            layer = next((int(p) for p in n.replace("/", ".").split(".") if p.isdigit()), None)
            if (".ffn.experts." in n.replace("/", ".") or ".ffn.router." in n.replace("/", ".")) and layer in table:
                o = table[layer][-1][1]
                x = x[o]   # label e holds REF's expert o[e]
                relabelled += 1
            worst = max(worst, float(np.abs(x - y).max(initial=0)))
    assert relabelled > 0, f"{run_w}: no relabelled tensor found"
    assert worst <= tol, f"{run_w}: weights differ from {ref_w}'s relabelled by {worst:.3g} > {tol}"
    print(f"ep_rebalance_check.py: {run_w} holds {ref_w}'s weights relabelled ({relabelled} tensors, max difference {worst:.3g})")


if __name__ == "__main__":
    if sys.argv[1] == "losses":
        losses(sys.argv[2], sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 1e-6,
               float(sys.argv[5]) if len(sys.argv) > 5 else 0.0)
    elif sys.argv[1] == "weights":
        weights(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]) if len(sys.argv) > 5 else 1e-6)
    else:
        sys.exit(f"usage: {__doc__}")
