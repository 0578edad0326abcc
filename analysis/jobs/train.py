"""train: /train/steps, /train/eval and the summary attributes of /train.

Tables: summary (first/final loss, mean step time and tokens/s without the first step, which
includes one-time setup) and per-phase step times; an MoE run's expert relabellings
(jobs/ep_placement.py). Plots: loss vs step (train and eval), step
time vs step. Combined: the summary with the differing configuration keys, losses overlaid.
"""
from analysis import compare
from analysis.jobs import ep_placement
from analysis.output import figure
from analysis.tables import Table, header, mean_std, num

SECTION = "train"
JOBS = {"train"}
STEPS, EVAL = "/train/steps", "/train/eval"
PHASES = ["forward", "backward", "comm", "optimizer"]
SUMMARY_COLUMNS = ["steps", "first loss", "final loss", "final eval loss", header("step time", "ms"),
                   "tokens/s", "parameters", header("wall", "s")]


def present(r):
    return r.has_table(STEPS) or bool(r.group_attrs("/train"))


def _after_first(frame):
    """Steps without the first one (setup, allocator warm-up) when there are at least two."""
    return frame.iloc[1:] if len(frame) > 1 else frame


def summary_cells(r):
    attrs = r.group_attrs("/train")
    steps = r.tables.get(STEPS)
    has_steps = steps is not None and len(steps) > 0
    first = attrs.get("first_loss", steps["loss"].iloc[0] if has_steps else None)
    final = attrs.get("final_loss", steps["loss"].iloc[-1] if has_steps else None)
    evals = r.tables.get(EVAL)
    eval_loss = evals["loss"].iloc[-1] if evals is not None and len(evals) else None
    step_ms = _after_first(steps)["step_ms"].mean() if has_steps else None
    tok_s = _after_first(steps)["tokens_per_s"].mean() if has_steps else None
    return [num(len(steps) if has_steps else None, "d"), num(first, ".4f"), num(final, ".4f"),
            num(eval_loss, ".4f"), num(step_ms, ".3f"), num(tok_s, ".0f"),
            num(attrs.get("parameters"), "d"), num(attrs.get("wall_s"), ".2f")]


def report(r, out, prefix):
    t = Table(f"{r.name}: training summary", SUMMARY_COLUMNS, numeric=[True] * len(SUMMARY_COLUMNS))
    t.add(*summary_cells(r))
    out.table(f"{prefix}.train_summary", t)
    ep_placement.report(r, out, prefix, "/train/ep_placement", "train_ep_placement")
    if not r.has_table(STEPS):
        return
    steps = r.tables[STEPS]
    timed = _after_first(steps)
    p = Table(f"{r.name}: step time per phase, first step excluded", ["phase", header("mean ± std", "ms"),
                                                                          header("min", "ms"), header("max", "ms")])
    for phase in PHASES + ["step"]:
        col = timed[f"{phase}_ms"]
        p.add(phase, mean_std(col.mean(), col.std(ddof=0)), num(col.min()), num(col.max()))
    out.table(f"{prefix}.train_phases", p)

    fig, (ax,) = figure()
    _plot_loss(ax, r, "train")
    ax.set_title(f"{r.name}: loss")
    out.figure(f"{prefix}.train_loss", fig)

    fig, (ax,) = figure()
    ax.plot(steps["step"], steps["step_ms"], label="step", color="black")
    for phase in PHASES:
        if steps[f"{phase}_ms"].abs().sum() > 0:
            ax.plot(steps["step"], steps[f"{phase}_ms"], label=phase, linewidth=1)
    ax.set(xlabel="step", ylabel="time (ms)", title=f"{r.name}: step time")
    if steps["step_ms"].max() > 5 * steps["step_ms"].median():  # a slow first step would flatten the rest
        ax.set_yscale("log")
    ax.legend()
    out.figure(f"{prefix}.train_step_time", fig)


def _plot_loss(ax, r, label):
    if r.has_table(STEPS):
        lines = ax.plot(r.tables[STEPS]["step"], r.tables[STEPS]["loss"], label=label)
        if r.has_table(EVAL):
            e = r.tables[EVAL]
            ax.plot(e["step"], e["loss"], "o--", color=lines[0].get_color(), label=f"{label} (eval)")
    ax.set(xlabel="step", ylabel="loss (nats)")
    ax.legend()


def combine(results, keys, out, prefix):
    t = Table("training runs compared", keys + SUMMARY_COLUMNS, numeric=[False] * len(keys) + [True] * len(SUMMARY_COLUMNS))
    for r in results:
        t.add(*compare.key_cells(r, keys), *summary_cells(r))
    out.table(f"{prefix}.train", t)
    fig, (ax1, ax2) = figure(2)
    for r in results:
        if r.has_table(STEPS):
            _plot_loss(ax1, r, compare.label(r, keys))
            ax2.plot(r.tables[STEPS]["step"], r.tables[STEPS]["step_ms"], label=compare.label(r, keys))
    ax1.set_title("loss")
    ax2.set(xlabel="step", ylabel="step time (ms)", title="step time")
    if any(r.has_table(STEPS) and r.tables[STEPS]["step_ms"].max() > 5 * r.tables[STEPS]["step_ms"].median()
           for r in results):
        ax2.set_yscale("log")
    ax2.legend()
    out.figure(f"{prefix}.train", fig)
