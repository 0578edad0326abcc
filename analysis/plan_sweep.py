"""plan: the planner's sweep of predicted tokens/s per GPU against the GPU count (docs/planner.md).

`run.job = plan` writes /plan/sweep: for 1, 2, 4, ... GPUs (plan.sweep_max_gpus) the best fitting
layout of each family (ddp, zero1, zero2, fsdp, with +tp and +pp), at the deck's batch per GPU.
This plots tokens/s per GPU against GPUs (log2 axis), one line per family, and writes the table as
Markdown beside it.

    python3 -m analysis.plan_sweep outputs/plan_llama3_8b.h5 --out outputs/plan
"""
import argparse
import os
import sys

import h5py

from analysis.h5load import frame

SWEEP = "/plan/sweep"


def load_sweep(path):
    """The /plan/sweep table of a plan results file as a DataFrame, and the /plan attributes."""
    with h5py.File(path, "r") as f:
        if SWEEP not in f:
            raise SystemExit(f"{path}: no {SWEEP} table (run.job = plan with plan.sweep_max_gpus > 0)")
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["/plan"].attrs.items()}
        return frame(f[SWEEP]), attrs


def plot_sweep(path, out_dir):
    """Writes plan_sweep.png and plan_sweep.md to out_dir; returns their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df, attrs = load_sweep(path)
    os.makedirs(out_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 5))
    # More families than a colour cycle has colours: each family gets its own colour and marker.
    colors = plt.get_cmap("tab20").colors
    markers = "os^vD<>ph*"
    for k, (family, rows) in enumerate(df.groupby("family", sort=True)):
        rows = rows.sort_values("gpus")
        ax.plot(rows["gpus"], rows["tokens_per_s_per_gpu"], marker=markers[k % len(markers)],
                color=colors[k % len(colors)], label=family)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("predicted tokens/s per GPU")
    ax.set_title(f"{attrs.get('cluster', '')}: best layout per family (calibration {attrs.get('calibration_device', '')})",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    png = os.path.join(out_dir, "plan_sweep.png")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    md = os.path.join(out_dir, "plan_sweep.md")
    with open(md, "w") as f:
        f.write("| GPUs | family | layout | tokens/s per GPU | step (ms) | MFU |\n| ---: | --- | --- | ---: | ---: | ---: |\n")
        for _, r in df.sort_values(["gpus", "family"]).iterrows():
            f.write(f"| {int(r['gpus'])} | {r['family']} | {r['layout']} | {r['tokens_per_s_per_gpu']:.0f} | "
                    f"{r['step_ms']:.1f} | {100 * r['mfu']:.1f}% |\n")
    return png, md


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", help="a results file of run.job = plan")
    p.add_argument("--out", default="outputs/plan", help="directory for plan_sweep.png and plan_sweep.md")
    a = p.parse_args(argv)
    for written in plot_sweep(a.file, a.out):
        print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
