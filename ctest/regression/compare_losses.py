#!/usr/bin/env python3
"""compare_losses.py REFERENCE RTOL PART [PART ...]

The /train/steps losses of the PART results files, taken together (each covers the steps it
ran: an interrupted run and its resumption), must match those of the REFERENCE run step by step:
every reference step is present exactly once among the parts, and |part - ref| <= RTOL * |ref|
(RTOL = 0: bitwise). Prints the largest relative difference; exit 1 on a mismatch.
"""
import sys

import h5py
import numpy as np


def steps(path):
    with h5py.File(path, "r") as f:
        t = f["/train/steps"][()]
    return {int(s): float(l) for s, l in zip(t["step"], t["loss"])}, t


def main():
    ref_path, rtol, parts = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    ref, _ = steps(ref_path)
    got = {}
    for p in parts:
        d, _ = steps(p)
        for s, l in d.items():
            if s in got:
                sys.exit(f"FAIL: step {s} is in more than one part ({p})")
            got[s] = l
    if sorted(got) != sorted(ref):
        sys.exit(f"FAIL: the parts hold steps {sorted(got)[:3]}..{sorted(got)[-3:]} ({len(got)}), "
                 f"the reference {len(ref)} steps")
    worst = 0.0
    bad = []
    for s, l in ref.items():
        rel = abs(got[s] - l) / max(abs(l), 1e-30)
        worst = max(worst, rel)
        if abs(got[s] - l) > rtol * abs(l):
            bad.append((s, l, got[s]))
    print(f"{len(ref)} steps, largest relative difference {worst:.3e} (tolerance {rtol:g})")
    for s, l, g in bad[:10]:
        print(f"  step {s}: reference {l!r}, parts {g!r}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
