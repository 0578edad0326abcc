"""The mixture-of-experts study (docs/moe.md): an MoE run against its dense twin of equal active
FLOPs, and the MoE run's load balance over training.

Reads two results files of `train` runs on the same data and tokens (inputs/moe_text.ini and
inputs/moe_text_dense.ini), and writes into --out:
  loss.png     training loss (and validation loss, markers) of both runs against training tokens,
               in one figure; the MoE curve is its language-model loss: the logged loss minus the
               router losses it includes (model.moe_aux_loss x balance + model.moe_z_loss x z,
               from /train/moe) at the logged steps
  balance.png  per MoE block: each expert's share of the assignments, the dropped fraction and
               the balance loss (1 = perfect balance) against the step
and prints a Markdown table of the final losses. Exit 1 when the MoE run's final validation loss
is not below the dense run's (the study's claim), so a script can rely on it.

    python3 -m analysis.moe_study outputs/moe_text.h5 outputs/moe_text_dense.h5 --out outputs/moe_study
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis import h5load  # noqa: E402
from analysis.output import save_loss_plot  # noqa: E402


def load_run(path):
    r = h5load.load(path)
    if not r.has_table("/train/steps"):
        raise SystemExit(f"{path}: no /train/steps (not a train run)")
    a = r.group_attrs("/train")
    steps = r.tables["/train/steps"]
    tokens_per_step = int(a.get("tokens_per_step"))
    run = {"path": path, "name": os.path.splitext(os.path.basename(path))[0], "steps": steps,
           "tokens_per_step": tokens_per_step, "moe": r.tables.get("/train/moe"),
           "eval": r.tables.get("/train/eval"), "parameters": int(a.get("parameters")),
           "active": int(a.get("parameters_active", a.get("parameters"))), "config": r.config}
    return run


def lm_loss(run):
    """(steps, loss) of the language-model loss at the logged steps: the MoE run's logged loss
    minus its router losses (sum over blocks of aux x balance + z x z-loss); the dense run's loss."""
    steps = run["steps"]
    moe = run["moe"]
    if moe is None or len(moe) == 0:
        return steps["step"].to_numpy(), steps["loss"].to_numpy()
    aux = float(run["config"].get("model.moe_aux_loss", 0))
    zc = float(run["config"].get("model.moe_z_loss", 0))
    router = (aux * moe["balance_loss"] + zc * moe["z_loss"]).groupby(moe["step"]).sum()
    logged = steps.set_index("step")["loss"]
    common = [s for s in router.index if s in logged.index]
    # The router losses of a logged row are the mean over the steps since the previous row; the
    # step's own loss is compared with that mean (they move slowly).
    return np.array(common), np.array([logged[s] - router[s] for s in common])


def plot_loss(moe, dense, out):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run, colour in ((dense, "tab:blue"), (moe, "tab:red")):
        s, l = lm_loss(run)
        label = f"{run['name']} ({run['active']:,} active of {run['parameters']:,} parameters)"
        ax.plot(s * run["tokens_per_step"], l, color=colour, label=label + ", training")
        if run["eval"] is not None and len(run["eval"]):
            e = run["eval"]
            ax.plot(e["step"] * run["tokens_per_step"], e["loss"], "o--", color=colour, label=run["name"] + ", validation")
    return save_loss_plot(fig, ax, "MoE against dense at equal active FLOPs per token", out)


def plot_balance(moe, out):
    t = moe["moe"]
    layers = sorted(t["layer"].unique())
    experts = [c for c in t.columns if c.startswith("expert_")]
    fig, axes = plt.subplots(len(layers), 2, figsize=(10, 3 * len(layers)), squeeze=False)
    for row, layer in zip(axes, layers):
        b = t[t["layer"] == layer]
        counts = b[experts].to_numpy(dtype=float)
        share = counts / counts.sum(axis=1, keepdims=True)
        for i, e in enumerate(experts):
            row[0].plot(b["step"], share[:, i], label=e.replace("expert_", "expert "))
        row[0].axhline(1.0 / len(experts), color="k", lw=0.8, ls=":")
        row[0].set_title(f"block {layer}: share of the assignments per expert")
        row[0].set_xlabel("step")
        row[0].legend(fontsize=6, ncol=2)
        row[1].plot(b["step"], b["balance_loss"], label="balance loss (1 = perfect)")
        row[1].plot(b["step"], b["dropped_fraction"], label="dropped fraction")
        row[1].set_title(f"block {layer}: balance and drops")
        row[1].set_xlabel("step")
        row[1].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out, "balance.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m analysis.moe_study", description=__doc__.split("\n\n")[0])
    p.add_argument("moe", help="results file of the MoE run")
    p.add_argument("dense", help="results file of its dense twin")
    p.add_argument("--out", required=True, help="folder for the figures")
    args = p.parse_args(argv)
    moe, dense = load_run(args.moe), load_run(args.dense)
    if moe["moe"] is None or len(moe["moe"]) == 0:
        raise SystemExit(f"{args.moe}: no /train/moe (not an MoE run)")
    if moe["tokens_per_step"] != dense["tokens_per_step"] or len(moe["steps"]) != len(dense["steps"]):
        raise SystemExit("the two runs differ in tokens per step or in steps: not a comparison at equal tokens")
    os.makedirs(args.out, exist_ok=True)
    loss_png, balance_png = plot_loss(moe, dense, args.out), plot_balance(moe, args.out)
    print("| run | parameters | active | final training LM loss | final validation loss |")
    print("| --- | ---: | ---: | ---: | ---: |")
    finals = {}
    for run in (moe, dense):
        _, l = lm_loss(run)
        v = float(run["eval"]["loss"].iloc[-1]) if run["eval"] is not None and len(run["eval"]) else float("nan")
        finals[run["name"]] = v
        print(f"| {run['name']} | {run['parameters']:,} | {run['active']:,} | {l[-1]:.4f} | {v:.4f} |")
    print(f"figures: {loss_png}, {balance_png}")
    return 0 if finals[moe["name"]] < finals[dense["name"]] else 1


if __name__ == "__main__":
    sys.exit(main())
