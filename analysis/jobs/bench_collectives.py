"""bench-collectives: /bench_collectives/results, one row per (op, backend, algo, dtype, ranks,
size, in-place); newer files also say the path taken and the number of nodes.

Table: every row. Plot: bus bandwidth vs message size (log x), one line per (backend, algo,
ranks, op) and, where they vary, dtype and in-place. Combined: the rows of every file with the
differing configuration keys in front, all lines in one plot.
"""
from analysis import compare
from analysis.output import figure
from analysis.tables import Table, header, num

SECTION = "bench_collectives"
JOBS = {"bench-collectives"}
RESULTS = "/bench_collectives/results"
# path and nodes (files from multi-node runs): one node vs two, shm vs hier vs the network
LINE_KEYS = ["backend", "algo", "path", "ranks", "nodes", "op"]
OPTIONAL_LINE_KEYS = ["dtype", "inplace"]
# column -> (header, format); units come from the table's `units` attribute.
COLUMNS = {"op": ("op", "s"), "backend": ("backend", "s"), "algo": ("algo", "s"), "path": ("path", "s"),
           "dtype": ("dtype", "s"), "ranks": ("ranks", "d"), "nodes": ("nodes", "d"), "bytes": ("size", "d"), "count": ("count", "d"), "inplace": ("in-place", "d"),
           "time_us_avg": ("time avg", ".2f"), "time_us_min": ("time min", ".2f"), "time_us_max": ("time max", ".2f"),
           "algbw_gbs": ("algbw", ".3f"), "busbw_gbs": ("busbw", ".3f"), "errors": ("errors", "d")}
TEXT = {"op", "backend", "algo", "path", "dtype"}


def present(r):
    return r.has_table(RESULTS)


def _columns(r):
    frame = r.tables[RESULTS]
    return [c for c in COLUMNS if c in frame]


def _headers(r, cols):
    return [header(COLUMNS[c][0], r.unit(RESULTS, c)) for c in cols]


def _cells(row, cols):
    return [num(row[c], COLUMNS[c][1]) if c not in TEXT else str(row[c]) for c in cols]


def report(r, out, prefix):
    cols = _columns(r)
    t = Table(f"{r.name}: collectives", _headers(r, cols), numeric=[c not in TEXT for c in cols])
    for _, row in r.tables[RESULTS].iterrows():
        t.add(*_cells(row, cols))
    out.table(f"{prefix}.bench_collectives", t)
    fig, (ax,) = figure()
    _plot(ax, r, "")
    ax.set_title(f"{r.name}: bus bandwidth")
    out.figure(f"{prefix}.bench_collectives_busbw", fig)


def _plot(ax, r, label_prefix):
    frame = r.tables[RESULTS]
    keys = [k for k in LINE_KEYS if k in frame] + [k for k in OPTIONAL_LINE_KEYS if k in frame and frame[k].nunique() > 1]
    for values, line in frame.groupby(keys, sort=False) if keys else [((), frame)]:
        values = values if isinstance(values, tuple) else (values,)
        line = line.sort_values("bytes")
        name = " ".join(f"{v}" if k in TEXT else f"{k}={v}" for k, v in zip(keys, values))
        ax.plot(line["bytes"], line["busbw_gbs"], "o-", label=(label_prefix + name).strip(), markersize=3)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)")
    ax.grid(True, which="both", alpha=0.3)
    # Outside the axes: with several files the labels are long and would hide the lines.
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def combine(results, keys, out, prefix):
    cols = _columns(results[0])
    t = Table("collectives compared", keys + _headers(results[0], cols),
              numeric=[False] * len(keys) + [c not in TEXT for c in cols])
    for r in results:
        for _, row in r.tables[RESULTS].iterrows():
            t.add(*compare.key_cells(r, keys), *[num(row[c], COLUMNS[c][1]) if c in row and c not in TEXT
                                                 else str(row.get(c, "")) for c in cols])
    out.table(f"{prefix}.bench_collectives", t)
    fig, (ax,) = figure(width=8)
    for r in results:
        # backend, algorithm, op and dtype are already in each line's name: prefix the file only
        _plot(ax, r, f"{r.name}: ")
    ax.set_title("bus bandwidth compared")
    out.figure(f"{prefix}.bench_collectives_busbw", fig)
