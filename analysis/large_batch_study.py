"""The large-batch study (issue 16, scripts/large_batch_study.sh, docs/optimizers.md).

Reads every results file of a folder (runs of the same deck at several global batches and
optimizers), plots training loss against training tokens for all of them in one figure (a
running mean over a fixed number of tokens, so runs with different step sizes are smoothed
alike) and prints a Markdown table: optimizer, batch, effective LR, steps, and the mean loss over
the last 10% of the tokens, the comparison at equal tokens.

    python3 -m analysis.large_batch_study outputs/large_batch_study --png docs/figures/large_batch_study.png
"""
import argparse
import glob
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis import h5load  # noqa: E402


def load_runs(folder):
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "*.h5"))):
        r = h5load.load(path)
        if not r.has_table("/train/steps"):
            continue
        a = r.group_attrs("/train")
        steps = r.tables["/train/steps"]
        tokens_per_step = a.get("tokens_per_step") or int(r.config["train.batch_size"]) * int(r.config["model.context_length"])
        runs.append({
            "name": os.path.splitext(os.path.basename(path))[0],
            "optimizer": a.get("optimizer", r.config.get("optim.name", "?")),
            "batch": int(a.get("global_batch", r.config["train.batch_size"])),
            "accum": int(a.get("grad_accum", r.config.get("train.grad_accum", 1))),
            "lr": float(a.get("lr_effective", float(r.config["optim.lr"]))),
            "tokens": (steps["step"].to_numpy() + 1) * tokens_per_step,
            "loss": steps["loss"].to_numpy(),
        })
    return sorted(runs, key=lambda x: (x["optimizer"], x["batch"]))


def smoothed(tokens, loss, window_tokens):
    """Mean of the losses of the steps within the last window_tokens tokens, at every step."""
    out = np.empty_like(loss)
    for i, t in enumerate(tokens):
        sel = (tokens > t - window_tokens) & (tokens <= t)
        out[i] = loss[sel].mean()
    return out


def tail_loss(run, share=0.1):
    t = run["tokens"]
    sel = t > t[-1] * (1 - share)
    return float(run["loss"][sel].mean())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--png", default=None, help="where to write the plot (default FOLDER/large_batch_study.png)")
    args = ap.parse_args(argv)
    runs = load_runs(args.folder)
    if not runs:
        print(f"no train results in {args.folder}", file=sys.stderr)
        return 1
    png = args.png or os.path.join(args.folder, "large_batch_study.png")
    window = max(r["tokens"][-1] for r in runs) / 32
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    styles = {"adamw": "-", "lamb": "--", "lars": ":", "sgd": "-."}
    batches = sorted({r["batch"] for r in runs})
    colors = dict(zip(batches, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for r in runs:
        ax.plot(r["tokens"], smoothed(r["tokens"], r["loss"], window), styles.get(r["optimizer"], "-"),
                color=colors[r["batch"]], label=f"{r['optimizer']} batch {r['batch']} (lr {r['lr']:.2g})")
    ax.set_xlabel("training tokens")
    ax.set_ylabel(f"training loss (nats, running mean over {window:.0f} tokens)")
    ax.set_title("Same tokens at batch B, 4B, 16B: linear LR scaling, adamw vs lamb")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=120, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {png}\n")
    print("| optimizer | global batch | grad_accum | effective lr | steps | tokens | loss, last 10% of tokens |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        print(f"| {r['optimizer']} | {r['batch']} | {r['accum']} | {r['lr']:.3g} | {len(r['loss'])} | "
              f"{int(r['tokens'][-1])} | {tail_loss(r):.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
