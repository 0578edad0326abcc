"""bench-model: /bench_model/steps and the summary attributes of /bench_model.

Tables: per phase mean ± std, min, median, max (ms); a summary (tokens/s, FLOP/s, MFU, peak
memory); for MoE models the routing balance (busiest expert and ep rank over the mean) and the
warm-up's expert relabellings (jobs/ep_placement.py). Plot: bar per phase with std error bars. Combined: the seed's table — the differing
configuration keys (e.g. model.size, model.context_length, precision.mode) -> forward,
backward and step time — and grouped bars.
"""
from analysis import compare
from analysis.jobs import ep_placement
from analysis.output import figure
from analysis.tables import Table, header, mean_std, mib, num

SECTION = "bench_model"
JOBS = {"bench-model"}
GROUP, STEPS = "/bench_model", "/bench_model/steps"
# phase name in attributes/columns -> name shown; "total" is the whole step; "period" the wall clock
# from a step's start to the next's (docs/hdf5.md; absent from files written before it existed).
PHASES = {"forward": "forward", "backward": "backward", "comm": "comm", "optimizer": "optimizer", "total": "step",
          "period": "period (wall)"}
PHASES_OF_MODE = {"forward": ["forward", "total", "period"],
                  "forward-backward": ["forward", "backward", "total", "period"],
                  "train-step": ["forward", "backward", "comm", "optimizer", "total", "period"]}


def present(r):
    return r.has_table(STEPS) or bool(r.group_attrs(GROUP))


def phase_stats(r, phase):
    """{mean, std, min, max, median} in ms from the attributes, else from the steps table."""
    attrs = r.group_attrs(GROUP)
    names = ["mean", "std", "min", "max", "median"]
    if all(f"{phase}_ms_{n}" in attrs for n in names):
        return {n: attrs[f"{phase}_ms_{n}"] for n in names}
    if r.has_table(STEPS) and f"{phase}_ms" in r.tables[STEPS]:
        col = r.tables[STEPS][f"{phase}_ms"]
        return {"mean": col.mean(), "std": col.std(ddof=0), "min": col.min(), "max": col.max(), "median": col.median()}
    return None


def phases(r):
    mode = r.group_attrs(GROUP).get("mode", r.config.get("bench.mode", ""))
    chosen = PHASES_OF_MODE.get(mode)
    if chosen is None:  # unknown mode: every phase that took time
        chosen = [p for p in PHASES if (phase_stats(r, p) or {}).get("max", 0) > 0 or p == "total"]
    return [p for p in chosen if phase_stats(r, p) is not None]


def report(r, out, prefix):
    attrs = r.group_attrs(GROUP)
    t = Table(f"{r.name}: time per phase", ["phase", header("mean ± std", "ms"), header("min", "ms"),
                                             header("median", "ms"), header("max", "ms")])
    for p in phases(r):
        s = phase_stats(r, p)
        t.add(PHASES[p], mean_std(s["mean"], s["std"]), num(s["min"]), num(s["median"]), num(s["max"]))
    out.table(f"{prefix}.bench_model_phases", t)

    mfu = attrs.get("mfu")
    s = Table(f"{r.name}: bench-model summary", ["mode", "precision", "batch", "context", "parameters", "tokens/s",
                                                 header("achieved", "TFLOP/s"), "MFU", header("peak memory", "MiB"),
                                                 "device"],
              numeric=[False, False] + [True] * 7 + [False])
    s.add(attrs.get("mode", ""), attrs.get("precision", ""), num(attrs.get("batch_size"), "d"),
          num(attrs.get("context_length"), "d"), num(attrs.get("parameters"), "d"), num(attrs.get("tokens_per_s"), ".0f"),
          num(None if attrs.get("achieved_flops") is None else attrs["achieved_flops"] / 1e12, ".3f"),
          num(None if mfu is None else mfu * 100, ".1f") + ("%" if mfu is not None and mfu == mfu else ""),
          mib(attrs.get("peak_bytes")), attrs.get("device_name", ""))
    out.table(f"{prefix}.bench_model_summary", s)

    # MoE models: how evenly the timed steps' rows fell on the experts and on the ep ranks
    # (docs/moe.md, "Outputs"); the per-step counts are /bench_model/moe.
    if "moe_expert_rows_max_over_mean" in attrs:
        m = Table(f"{r.name}: MoE routing balance (busiest over mean, timed steps)",
                  ["ep", "busiest expert / mean", "busiest ep rank / mean"])
        m.add(r.config.get("parallel.ep", "1"), num(attrs["moe_expert_rows_max_over_mean"], ".3f"),
              num(attrs.get("moe_ep_rank_rows_max_over_mean"), ".3f"))
        out.table(f"{prefix}.bench_model_moe_balance", m)
    ep_placement.report(r, out, prefix, "/bench_model/ep_placement", "bench_model_ep_placement")

    fig, (ax,) = figure()
    ps = phases(r)
    stats = [phase_stats(r, p) for p in ps]
    ax.bar([PHASES[p] for p in ps], [x["mean"] for x in stats], yerr=[x["std"] for x in stats], capsize=4)
    ax.set(ylabel="time (ms)", title=f"{r.name}: time per phase (mean ± std)")
    out.figure(f"{prefix}.bench_model_phases", fig)


def combine(results, keys, out, prefix):
    shown = [p for p in ["forward", "backward", "total"] if any(p in phases(r) for r in results)]
    cols = keys + [header(PHASES[p], "ms") for p in shown] + ["tokens/s", header("peak memory", "MiB")]
    t = Table("bench-model runs compared (mean ± std)", cols, numeric=[False] * len(keys) + [True] * (len(cols) - len(keys)))
    for r in results:
        cells = []
        for p in shown:
            s = phase_stats(r, p) if p in phases(r) else None
            cells.append(mean_std(s["mean"], s["std"]) if s else "")
        attrs = r.group_attrs(GROUP)
        t.add(*compare.key_cells(r, keys), *cells, num(attrs.get("tokens_per_s"), ".0f"), mib(attrs.get("peak_bytes")))
    out.table(f"{prefix}.bench_model", t)

    fig, (ax,) = figure(width=max(6.4, 1.2 * len(results)))
    width = 0.8 / len(shown)
    for i, p in enumerate(shown):
        xs = [j + i * width for j in range(len(results))]
        stats = [phase_stats(r, p) if p in phases(r) else None for r in results]
        ax.bar(xs, [s["mean"] if s else 0 for s in stats], width, yerr=[s["std"] if s else 0 for s in stats],
               capsize=3, label=PHASES[p])
    ax.set_xticks([j + width * (len(shown) - 1) / 2 for j in range(len(results))])
    ax.set_xticklabels([compare.label(r, keys) for r in results], rotation=20, ha="right")
    ax.set(ylabel="time (ms)", title="bench-model runs compared")
    ax.legend()
    out.figure(f"{prefix}.bench_model", fig)


# Keys that differ between runs of one study without being part of it.
NOISE_KEYS = {"bench.steps", "bench.warmup"}


def versus(results, key, out, prefix):
    """A study against one configuration key (e.g. bench.batch_size): tokens/s and peak memory per
    run, one line per combination of the other keys that differ (e.g. checkpointing on and off)."""
    others = [k for k in compare.differing_keys(results) if k != key and k not in NOISE_KEYS]
    series = {}
    for r in compare.sorted_by_keys(results, [key]):
        series.setdefault(tuple(r.config.get(k, "") for k in others), []).append(r)
    t = Table(f"bench-model: tokens/s and peak memory against {key}",
              others + [key, "tokens/s", header("peak memory", "GiB")],
              numeric=[False] * len(others) + [False, True, True])
    fig, (tput, mem) = figure(ncols=2)
    for values, runs in sorted(series.items()):
        xs = [r.config.get(key, "") for r in runs]
        try:
            xs = [float(x) for x in xs]
        except ValueError:
            pass
        tps = [r.group_attrs(GROUP).get("tokens_per_s") for r in runs]
        peaks = [(r.group_attrs(GROUP).get("peak_bytes") or 0) / 2**30 for r in runs]
        for r, a, b in zip(runs, tps, peaks):
            t.add(*values, r.config.get(key, ""), num(a, ".0f"), num(b, ".2f"))
        label = ", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in zip(others, values)) or "runs"
        tput.plot(xs, tps, marker="o", label=label)
        mem.plot(xs, peaks, marker="o", label=label)
    name = key.split(".", 1)[-1]
    tput.set(xlabel=name, ylabel="tokens/s", title=f"throughput against {name}")
    mem.set(xlabel=name, ylabel="peak memory per rank (GiB)", title=f"peak memory against {name}")
    tput.legend()
    out.table(f"{prefix}.bench_model", t)
    out.figure(f"{prefix}.bench_model", fig)
