"""prune: /prune/rounds (per round: sparsity of the pruned set, parameters kept, validation
loss, for structured pruning the loss and forward time of the physically smaller model) and the
/prune attributes (method, schedule, target, gamma, final round and loss).

Table: the rounds. Plot: validation loss against parameters kept (log x), and for structured
pruning the forward time of the smaller model on a second axis. Combined: the curves of several
files (e.g. unstructured vs structured, fixed vs loss-guided) in one plot.
"""
import math

from analysis import compare
from analysis.output import figure
from analysis.tables import Table, header, num

SECTION = "prune"
JOBS = {"prune"}
ROUNDS = "/prune/rounds"


def present(r):
    return r.has_table(ROUNDS)


def _structured(r):
    return r.group_attrs("/prune").get("method") == "structured"


def report(r, out, prefix):
    a = r.group_attrs("/prune")
    structured = _structured(r)
    cols = ["round", "sparsity", "parameters kept", header("val loss", "nats")]
    if structured:
        cols += ["d_ff", header("export val loss", "nats"), header("forward", "ms"), header("export forward", "ms")]
    cols += ["within bound"]
    t = Table(f"{r.name}: {a.get('schedule', '?')} {a.get('method', '?')} pruning (target "
              f"{num(a.get('target_sparsity'), '.3f')}, gamma {num(a.get('gamma'), '.4f')}, "
              f"{a.get('finetune_steps', '?')} fine-tuning steps per round)", cols, numeric=[True] * len(cols))
    for _, row in r.tables[ROUNDS].iterrows():
        cells = [num(int(row["round"]), "d"), num(row["sparsity"], ".4f"), num(int(row["parameters_kept"]), "d"),
                 num(row["val_loss"], ".4f")]
        if structured:
            cells += [num(int(row["d_ff"]), "d"), num(row["export_val_loss"], ".4f"), num(row["forward_ms"], ".3f"),
                      num(row["export_forward_ms"], ".3f")]
        cells.append("yes" if row["accepted"] else "no")
        t.add(*cells)
    out.table(f"{prefix}.prune_rounds", t)
    out.figure(f"{prefix}.prune", _plot([r], lambda x: a.get("method", "")))


def _plot(results, label):
    fig, (ax,) = figure()
    twin = None
    for r in results:
        rows = r.tables[ROUNDS]
        lines = ax.plot(rows["parameters_kept"], rows["val_loss"], "o-", label=f"{label(r)} val loss")
        if _structured(r) and not rows["export_forward_ms"].iloc[1:].isna().all():
            twin = twin or ax.twinx()
            ms = rows["export_forward_ms"].copy()
            ms.iloc[0] = rows["forward_ms"].iloc[0]  # round 0: the unpruned model
            twin.plot(rows["parameters_kept"], ms, "s--", color=lines[0].get_color(), alpha=0.6,
                      label=f"{label(r)} forward")
    ax.set(xlabel="parameters kept", ylabel="validation loss (nats)", title="pruning: loss vs parameters kept")
    ax.set_xscale("log")
    ax.invert_xaxis()
    if twin is not None:
        twin.set_ylabel("forward time of the pruned model (ms)")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = twin.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2)
    else:
        ax.legend()
    return fig


def combine(results, keys, out, prefix):
    t = Table("pruning runs compared", keys + ["final round", "final sparsity", header("final val loss", "nats")],
              numeric=[False] * len(keys) + [True] * 3)
    for r in results:
        a = r.group_attrs("/prune")
        t.add(*compare.key_cells(r, keys), num(a.get("final_round"), "d"), num(a.get("final_sparsity"), ".4f"),
              num(a.get("final_val_loss"), ".4f"))
    out.table(f"{prefix}.prune", t)
    out.figure(f"{prefix}.prune", _plot(results, lambda r: compare.label(r, keys)))
