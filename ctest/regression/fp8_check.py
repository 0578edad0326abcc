#!/usr/bin/env python3
"""fp8_check.py OUTDIR: the comparisons of fp8_check.sh over its results files fp8_NAME.h5."""
import os
import sys

import h5py
import numpy as np

# FP8 against fp32 on tiny_fp8.ini: measured worst 0.28% (current) and 0.20% (delayed) over 12
# steps; the bound leaves 7x room for BLAS and compiler differences while a broken cast, scale or
# transpose moves the loss by far more (a wrong scale by 2x shows as several percent at step 1).
FP32_RTOL = 0.02
# Some step must differ from fp32 by more than this: the FP8 layers ran (fp32 reproduces itself
# bitwise, and the FP8 casts change the first loss by about 1e-3).
FP8_RAN_ATOL = 1e-4
# 2 ranks against one process with the same micro-batches: the same FP8 products, gradients
# summed in another order (measured: bitwise equal).
DP_RTOL = 1e-5

out = sys.argv[1]
failures = []


def load(name):
    with h5py.File(os.path.join(out, f"fp8_{name}.h5"), "r") as f:
        steps = f["/train/steps"][()]
        d = {"loss": steps["loss"].astype(float), "grad_norm": steps["grad_norm"].astype(float)}
        if "/train/fp8" in f:
            t = f["/train/fp8"][()]
            d["table"] = np.stack([t["amax"], t["amax_window_max"], t["scale"]])
            d["recorded_steps"] = sorted(set(int(x) for x in t["step"]))
            d["step_of_row"] = t["step"].astype(int)
            names = [x.decode().rstrip("\0") if isinstance(x, bytes) else str(x) for x in t["gemm"]]
            d["gemms"] = list(dict.fromkeys(names))   # first-seen order: the forward's
            d["history"] = f["/train/fp8_amax_history"][()]
            d["attrs"] = dict(f["/train/fp8"].attrs)
        return d


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


fp32 = load("fp32")
check("table" not in fp32, "fp32 run records no /train/fp8")
for scaling in ("current", "delayed"):
    ref = load(f"{scaling}_none")
    rel = np.abs(ref["loss"] - fp32["loss"]) / np.abs(fp32["loss"])
    check(rel.max() <= FP32_RTOL, f"{scaling}: fp8 losses within {FP32_RTOL:.0%} of fp32 (worst {rel.max():.2e})")
    diff = np.abs(ref["loss"] - fp32["loss"]).max()
    check(diff > FP8_RAN_ATOL, f"{scaling}: fp8 differs from fp32 (largest loss difference {diff:.2e})")
    check(ref["loss"][-1] < ref["loss"][0], f"{scaling}: fp8 trains (loss {ref['loss'][0]:.4f} -> {ref['loss'][-1]:.4f})")
    # The results file's FP8 record.
    H = 16 if scaling == "delayed" else 1
    # q|k|v one layer, w1|w3 one layer (each group back to back in the store).
    check(ref["gemms"] == ["qkv", "o", "w13", "w2"],
          f"{scaling}: /train/fp8 names the layers qkv, o, w13, w2 in forward order: {ref['gemms']}")
    G = 4
    check(ref["history"].shape == (2, G, 3, H),
          f"{scaling}: fp8_amax_history is [2, {G}, 3, {H}], is {ref['history'].shape}")
    # Recorded at the logged steps (log_every = 3, the first and the last): 1, 3, 6, 9, 12.
    check(ref["recorded_steps"] == [1, 3, 6, 9, 12] and ref["table"].shape[1] == 5 * 2 * G * 3,
          f"{scaling}: /train/fp8 has a row per logged step, layer, gemm and operand")
    check(ref["attrs"]["fp8_scaling"] == scaling and int(ref["attrs"]["fp8_history"]) == H,
          f"{scaling}: /train/fp8 attributes name the recipe and window")
    check(bool(np.all(ref["table"][2] > 0)) and bool(np.all(np.log2(ref["table"][2]) % 1 == 0)),
          f"{scaling}: every recorded scale is a power of two")
    # Activation checkpointing: bitwise the run without it, flash against flash.
    for name, base in (("every1", ref), ("selective", ref), ("selective_mlp", ref),
                       ("every2_keep_attention", load(f"{scaling}_flash"))):
        got = load(f"{scaling}_{name}")
        same = all(np.array_equal(got[k], base[k]) for k in ("loss", "grad_norm", "table", "history"))
        check(same, f"{scaling}: {name} bitwise equal to no checkpointing (losses, norms, amaxes, scales, histories)")
# precision.fp8_fast_accum: recorded in /train/fp8, and ignored by the CPU emulation (its fp64
# products model no tensor-core accumulator): every setting bitwise the default's run.
base = load("current_none")
check(base["attrs"]["fp8_fast_accum"] in ("forward", b"forward"),
      "current: /train/fp8 records fp8_fast_accum = forward")
for setting in ("all", "none"):
    got = load(f"current_fast_{setting}")
    check(got["attrs"]["fp8_fast_accum"] in (setting, setting.encode()),
          f"fp8_fast_accum = {setting}: /train/fp8 records it")
    same = all(np.array_equal(got[k], base[k]) for k in ("loss", "grad_norm", "table", "history"))
    check(same, f"fp8_fast_accum = {setting}: the CPU run is bitwise the default's (the emulation ignores it)")
ev = load("delayed_eval")
same = all(np.array_equal(ev[k], load("delayed_none")[k]) for k in ("loss", "grad_norm", "history"))
check(same, "delayed: evaluations leave training and the amax histories unchanged")
one = load("current_accum2")
for name in ("ddp", "zero2", "fsdp", "fsdp_offload"):
    got = load(name)
    rel = (np.abs(got["loss"] - one["loss"]) / np.abs(one["loss"])).max()
    check(rel <= DP_RTOL, f"{name} on 2 ranks within {DP_RTOL} of one process with grad_accum 2 (worst {rel:.1e})")
# fsdp's FP8 weight gathers: the same amax (the dp group's max), scale and cast as the layer's own
# cast of the gathered compute-dtype weight, so bitwise the same run.
for name, base in (("fsdp_gfp8", "fsdp"), ("fsdp_gfp8_every1", "fsdp"), ("fsdp_gfp8_selective_mlp", "fsdp"),
                   ("fsdp_gfp8_keep", "fsdp"), ("fsdp_gfp8_offload", "fsdp_offload"),
                   ("fsdp_gfp8_offload_params", "fsdp_offload_params"), ("fsdp4_gfp8", "fsdp4")):
    got, want = load(name), load(base)
    same = all(np.array_equal(got[k], want[k]) for k in ("loss", "grad_norm", "table"))
    check(same, f"{name} bitwise equal to {base} (losses, gradient norms, recorded amaxes and scales)")
one4 = load("current_accum4")
for name, ref in (("fsdp_gfp8", one), ("fsdp4_gfp8", one4)):
    got = load(name)
    rel = (np.abs(got["loss"] - ref["loss"]) / np.abs(ref["loss"])).max()
    check(rel <= DP_RTOL, f"{name} within {DP_RTOL} of one process with the same micro-batches (worst {rel:.1e})")
full, part_a, part_b = load("current_none"), load("resume_a"), load("resume_b")
check(np.array_equal(np.concatenate([part_a["loss"], part_b["loss"]]), full["loss"]),
      "current: a checkpoint at step 6 resumed to 12 equals the uninterrupted run bitwise")
for full_name, a, b, what in [("delayed_none", "resume_d_a", "resume_d_b", "1 rank, one file"),
                              ("delayed_h4", "resume_h4_a", "resume_h4_b", "1 rank, one file, a window of 4"),
                              ("delayed_ddp", "resume_d2_a", "resume_d2_b", "2 ranks, one file"),
                              ("delayed_ddp", "resume_ds_a", "resume_ds_b", "2 ranks, sharded")]:
    full, part_a, part_b = load(full_name), load(a), load(b)
    # The resumed run's recorded rows (amax, window maximum, scale) at each step it recorded, and
    # its final amax histories, against the uninterrupted run's.
    common = [st for st in part_b["recorded_steps"] if st in full["recorded_steps"]]
    rows = bool(common) and all(
        np.array_equal(part_b["table"][:, part_b["step_of_row"] == st], full["table"][:, full["step_of_row"] == st])
        for st in common)
    check(np.array_equal(np.concatenate([part_a["loss"], part_b["loss"]]), full["loss"]) and
          np.array_equal(np.concatenate([part_a["grad_norm"], part_b["grad_norm"]]), full["grad_norm"]) and rows and
          np.array_equal(part_b["history"], full["history"]),
          f"delayed ({what}): a checkpoint at step 6 resumed to 12 equals the uninterrupted run bitwise (losses, "
          f"norms, the /train/fp8 rows of steps {common}, the final histories)")
sys.exit(1 if failures else 0)
