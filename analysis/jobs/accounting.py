"""accounting: the predictions of `run.job = accounting` (docs/jobs.md, docs/hdf5.md).

Tables: the summary (parameters, local batch, peak bytes per rank, communication per step and its
formula, FLOPs per step, ideal step time, whether lmscale would refuse the run), the memory
components with their formulas (/accounting/memory), the per-phase peaks as the CPU allocator and a
CUDA run would count them (/accounting/memory_phases), the degree at which each strategy becomes
communication-bound (/accounting/comm_bound_degree) and, with cost.tokens > 0, the cost estimate
(/accounting/cost). Combined: the summary of several files with their differing keys.
"""
from analysis import compare
from analysis.tables import Table, header, mib, num

SECTION = "accounting"
JOBS = {"accounting"}
MEMORY, PHASES, BOUND, COST = ("/accounting/memory", "/accounting/memory_phases",
                               "/accounting/comm_bound_degree", "/accounting/cost")


def present(r):
    return "/accounting" in r.groups or r.has_table(MEMORY)


def _summary_cells(a):
    return [num(a.get("parameters"), "d"), num(a.get("local_batch"), "d"), mib(a.get("peak_bytes_per_rank")),
            mib(a.get("comm_bytes_per_step_per_rank")), num(a.get("flops_per_step"), ".4g"),
            num(None if a.get("ideal_step_s") is None else a["ideal_step_s"] * 1e3, ".4g"),
            "yes: " + a["run_refused"] if a.get("run_refused") else "no"]


SUMMARY = ["parameters", "local batch", header("peak per rank", "MiB"), header("comm per step per rank", "MiB"),
           "FLOPs per step", header("ideal step", "ms"), "refused"]


def report(r, out, prefix):
    a = r.group_attrs("/accounting")
    t = Table(f"{r.name}: accounting of {a.get('mode', '?')} ({a.get('memory_model_layout', '')})", ["quantity", "value"])
    for name, cell in zip(SUMMARY, _summary_cells(a)):
        t.add(name, cell)
    t.add("communication formula", a.get("comm_formula", ""))
    if a.get("tp_comm_formula"):
        t.add("tensor-parallel communication", a["tp_comm_formula"])
    out.table(f"{prefix}.accounting_summary", t)
    if r.has_table(MEMORY):
        m = Table(f"{r.name}: predicted memory per rank by component", ["component", header("bytes", "MiB"), "formula"],
                  numeric=[False, True, False])
        for _, row in r.tables[MEMORY].iterrows():
            m.add(row["component"], mib(row["bytes"]), row["formula"])
        out.table(f"{prefix}.accounting_memory", m)
    if r.has_table(PHASES):
        p = Table(f"{r.name}: predicted peak per phase", ["phase", header("CPU", "MiB"), header("CUDA", "MiB")])
        for _, row in r.tables[PHASES].iterrows():
            p.add(row["phase"], mib(row["cpu_bytes"]), mib(row["cuda_bytes"]))
        out.table(f"{prefix}.accounting_phases", p)
    if r.has_table(BOUND):
        b = Table(f"{r.name}: degree at which each strategy becomes communication-bound",
                  ["strategy", "degree", "limit", "split", "formula"], numeric=[False, True, True, False, False])
        for _, row in r.tables[BOUND].iterrows():
            b.add(row["strategy"], num(int(row["degree"]), "d"), num(int(row["limit"]), "d"), row["split"], row["formula"])
        out.table(f"{prefix}.accounting_comm_bound", b)
    if r.has_table(COST):
        c = Table(f"{r.name}: cost of {num(r.group_attrs('/accounting/cost').get('tokens'), '.4g')} tokens",
                  ["item", header("wall", "h"), "GPU-hours", "cost", "formula"], numeric=[False, True, True, True, False])
        for _, row in r.tables[COST].iterrows():
            c.add(row["item"], num(row["hours"], ".4g"), num(row["gpu_hours"], ".4g"), num(row["cost"], ".4g"),
                  row["formula"])
        out.table(f"{prefix}.accounting_cost", c)


def combine(results, keys, out, prefix):
    t = Table("accounting runs compared", keys + SUMMARY, numeric=[False] * len(keys) + [True] * (len(SUMMARY) - 1) + [False])
    for r in results:
        t.add(*compare.key_cells(r, keys), *_summary_cells(r.group_attrs("/accounting")))
    out.table(f"{prefix}.accounting", t)
