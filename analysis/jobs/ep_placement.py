"""The expert relabellings of parallel.ep_rebalance_every (/train/ep_placement, /bench_model/ep_placement;
docs/moe.md, "Rebalancing the ep ranks"): one table row per relabelling step, over the MoE blocks.
Shared by the train and bench-model reports.
"""
from analysis.tables import Table, header, num


def report(r, out, prefix, path, name):
    """Adds `{prefix}.{name}` when r has the table at `path`: per relabelling step, the blocks
    relabelled, the experts moved, the busiest ep rank's rows over the mean rank's before and after
    (means over the blocks) and the seconds the moves took."""
    if not r.has_table(path):
        return
    t = r.tables[path]
    table = Table(f"{r.name}: experts relabelled to even the ep ranks (busiest rank / mean, that step's rows)",
                  ["after step", "blocks relabelled", "experts moved", "busiest rank before", "busiest rank after",
                   header("moves", "s")])
    for step, rows in t.groupby("step", sort=True):
        table.add(num(int(step), "d"), num(int((rows["moved"] > 0).sum()), "d"), num(int(rows["moved"].sum()), "d"),
                  num(float(rows["busiest_rank_before"].mean())), num(float(rows["busiest_rank_after"].mean())),
                  num(float(rows["seconds"].sum()), ".2f"))
    out.table(f"{prefix}.{name}", table)
