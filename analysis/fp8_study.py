"""The FP8 convergence study (docs/precision.md, "The FP8 study"): one model trained in bf16 and
in precision.mode = fp8 with current and with delayed scaling on the same data, tokens and seed.

Reads the `train` results files (bf16, fp8 current, and fp8 delayed where given) and writes
into --out:
  loss.png   the training loss of the runs against training tokens in one figure (the
             validation losses as markers where the runs evaluated)
and prints a Markdown table of each run's final training and validation loss and its ratio to the
bf16 run's. With --xl-bf16 and --xl-fp8 (results files of bench-model runs, several repeats each)
it also prints the median tokens/s of each precision and their ratio.
Exit 1 when an fp8 run's final training loss is more than --max-ratio (default 1.02) times the
bf16 run's, so that a script can rely on the study's claim.

    python3 -m analysis.fp8_study bf16.h5 fp8_current.h5 [fp8_delayed.h5] --out outputs/fp8_study \
        [--xl-bf16 A.h5 ...] [--xl-fp8 B.h5 ...] [--title T] [--max-ratio R]
"""
import argparse
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis import h5load  # noqa: E402
from analysis.output import save_loss_plot  # noqa: E402

COLOURS = {"bf16": "tab:blue", "fp8 current": "tab:red", "fp8 delayed": "tab:green"}


def load_run(path, label):
    r = h5load.load(path)
    if not r.has_table("/train/steps"):
        raise SystemExit(f"{path}: no /train/steps (not a train run)")
    a = r.group_attrs("/train")
    return {"path": path, "label": label, "steps": r.tables["/train/steps"], "eval": r.tables.get("/train/eval"),
            "tokens_per_step": int(a.get("tokens_per_step")), "precision": r.config.get("precision.mode", "")}


def finals(runs):
    """[(label, final training loss, final validation loss or nan, training ratio to the first run)]."""
    base = float(runs[0]["steps"]["loss"].iloc[-1])
    out = []
    for run in runs:
        train = float(run["steps"]["loss"].iloc[-1])
        ev = run["eval"]
        val = float(ev["loss"].iloc[-1]) if ev is not None and len(ev) else float("nan")
        out.append((run["label"], train, val, train / base))
    return out


def plot_losses(runs, out, title):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        colour = COLOURS.get(run["label"])
        s = run["steps"]
        ax.plot(s["step"] * run["tokens_per_step"], s["loss"], color=colour, lw=1, label=run["label"] + ", training")
        ev = run["eval"]
        if ev is not None and len(ev):
            ax.plot(ev["step"] * run["tokens_per_step"], ev["loss"], "o", color=colour, label=run["label"] + ", validation")
    return save_loss_plot(fig, ax, title, out)


def median_tokens_per_s(paths):
    v = [float(h5load.load(p).group_attrs("/bench_model").get("tokens_per_s")) for p in paths]
    return statistics.median(v) if v else float("nan")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m analysis.fp8_study", description=__doc__.split("\n\n")[0])
    p.add_argument("bf16", help="results file of the bf16 run")
    p.add_argument("fp8_current", help="results file of the fp8 run, current scaling")
    p.add_argument("fp8_delayed", nargs="?", help="results file of the fp8 run, delayed scaling (optional)")
    p.add_argument("--out", required=True, help="folder for the figure")
    p.add_argument("--title", default=None, help="the figure's title (default: bf16 against FP8 and the recipes)")
    p.add_argument("--max-ratio", type=float, default=1.02, help="largest final-loss ratio fp8 / bf16 accepted")
    p.add_argument("--xl-bf16", nargs="*", default=[], help="bench-model results files of xl in bf16")
    p.add_argument("--xl-fp8", nargs="*", default=[], help="bench-model results files of xl in fp8")
    args = p.parse_args(argv)
    runs = [load_run(args.bf16, "bf16"), load_run(args.fp8_current, "fp8 current")]
    if args.fp8_delayed:
        runs.append(load_run(args.fp8_delayed, "fp8 delayed"))
    title = args.title or ("bf16 against FP8 (current and delayed scaling)" if args.fp8_delayed
                           else "bf16 against FP8 (current scaling)")
    if len({(r["tokens_per_step"], len(r["steps"])) for r in runs}) != 1:
        raise SystemExit("the runs differ in tokens per step or in steps: not a comparison at equal tokens")
    os.makedirs(args.out, exist_ok=True)
    png = plot_losses(runs, args.out, title)
    print("| run | final training loss | final validation loss | training loss / bf16 |")
    print("| --- | ---: | ---: | ---: |")
    rows = finals(runs)
    for label, train, val, ratio in rows:
        print(f"| {label} | {train:.4f} | {val:.4f} | {ratio:.4f} |")
    if args.xl_bf16 and args.xl_fp8:
        b, f = median_tokens_per_s(args.xl_bf16), median_tokens_per_s(args.xl_fp8)
        print(f"xl bench-model: bf16 {b:.0f} tokens/s, fp8 {f:.0f} tokens/s, fp8 / bf16 = {f / b:.3f}")
    print(f"figure: {png}")
    return 0 if all(ratio <= args.max_ratio for _, _, _, ratio in rows[1:]) else 1


if __name__ == "__main__":
    sys.exit(main())
