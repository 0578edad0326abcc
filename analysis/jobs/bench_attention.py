"""bench-attention: /bench_attention/results, one row per (impl, pass, dtype, causal, batch,
heads, seq, head_dim); status "ok" or "OOM" (an out-of-memory case is recorded, not fatal).

Table: every row, OOM rows marked. Plot: latency vs sequence length, one panel per head_dim,
one line per implementation (and pass/dtype/... where they vary); an OOM point is an x at the
top of its panel. Combined: the rows of every file with the differing configuration keys.
"""
import math

from matplotlib.ticker import FuncFormatter

from analysis import compare
from analysis.output import figure
from analysis.tables import Table, header, mib, num

SECTION = "bench_attention"
JOBS = {"bench-attention"}
RESULTS = "/bench_attention/results"
CASE = ["impl", "pass", "dtype", "causal", "batch", "heads", "seq", "head_dim"]
LINE_KEYS = ["impl", "pass", "dtype", "causal", "batch", "heads"]


def present(r):
    return r.has_table(RESULTS)


def is_oom(row):
    return str(row.get("status", "ok")).strip().lower() == "oom"


def _headers(r):
    return [header("time", r.unit(RESULTS, "time_ms")), header("min", r.unit(RESULTS, "time_ms_min")),
            header("max", r.unit(RESULTS, "time_ms_max")), "TFLOP/s", header("memory before backward", "MiB"), "status"]


def _cells(row):
    case = [str(row[c]) for c in CASE if c in row]
    if is_oom(row):
        return case + ["OOM", "", "", "", "", "OOM"]
    return case + [num(row.get("time_ms")), num(row.get("time_ms_min")), num(row.get("time_ms_max")),
                   num(row.get("tflops"), ".2f"), mib(row.get("mem_before_backward_bytes")), str(row.get("status", "ok"))]


def _table(title, results, keys):
    frame0 = results[0].tables[RESULTS]
    case = [c for c in CASE if c in frame0]
    cols = keys + case + _headers(results[0])
    numeric = [False] * len(keys) + [c in ("batch", "heads", "seq", "head_dim") for c in case] + [True] * 5 + [False]
    t = Table(title, cols, numeric=numeric)
    for r in results:
        for _, row in r.tables[RESULTS].iterrows():
            t.add(*compare.key_cells(r, keys), *_cells(row))
    return t


def report(r, out, prefix):
    out.table(f"{prefix}.bench_attention", _table(f"{r.name}: attention benchmark", [r], []))
    _plot(out, [r], [], f"{prefix}.bench_attention_latency", f"{r.name}: attention latency")


def _tick(y, _=None):
    return f"{y:g}"


def _mantissa(y):
    return round(y / 10 ** math.floor(math.log10(y))) if y > 0 else 0


def _plot(out, results, keys, name, title):
    head_dims = sorted({int(d) for r in results for d in r.tables[RESULTS]["head_dim"]})
    fig, axes = figure(len(head_dims), width=5.0)
    for ax, d in zip(axes, head_dims):
        for r in results:
            frame = r.tables[RESULTS]
            frame = frame[frame["head_dim"] == d]
            lk = [k for k in LINE_KEYS if k in frame and (k == "impl" or r.tables[RESULTS][k].nunique() > 1)]
            for values, line in frame.groupby(lk, sort=False):
                values = values if isinstance(values, tuple) else (values,)
                label = " ".join(str(v) if k in ("impl", "pass", "dtype") else f"{k}={v}" for k, v in zip(lk, values))
                if keys:
                    label = f"{compare.label(r, keys)}: {label}"
                line = line.sort_values("seq")
                ok = line[[not is_oom(row) for _, row in line.iterrows()]]
                oom = line[[is_oom(row) for _, row in line.iterrows()]]
                drawn = ax.plot(ok["seq"], ok["time_ms"], "o-", markersize=3, label=label)
                if len(oom):
                    # OOM: an x at the top of the panel (x in data, y in axes coordinates).
                    ax.plot(oom["seq"], [0.95] * len(oom), "x", color=drawn[0].get_color(), markersize=9,
                            markeredgewidth=2, transform=ax.get_xaxis_transform(), clip_on=False,
                            label=f"{label}: OOM")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi * 1.5)  # headroom for the OOM marks
        ax.yaxis.set_major_formatter(FuncFormatter(_tick))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: _tick(y) if _mantissa(y) in (2, 5) else ""))
        ax.set(xlabel="sequence length", ylabel="time (ms)", title=f"head_dim {d}  (x = out of memory)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    out.figure(name, fig)


def combine(results, keys, out, prefix):
    out.table(f"{prefix}.bench_attention", _table("attention compared", results, keys))
    _plot(out, results, keys, f"{prefix}.bench_attention_latency", "attention latency compared")
