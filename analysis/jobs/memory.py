"""Memory profile: /memory/peaks (peak bytes per phase) and /memory/timeline (every allocation
and free: time, delta, bytes in use, tag), written by bench-model and train.

Table: peaks. Plot: bytes in use vs time. Combined: peaks per file (one column per phase),
timelines overlaid.
"""
from analysis import compare
from analysis.output import figure
from analysis.tables import Table, header, mib, num

SECTION = "memory"
JOBS = set()   # any job may profile memory
PEAKS, TIMELINE = "/memory/peaks", "/memory/timeline"


def present(r):
    return r.has_table(PEAKS) or r.has_table(TIMELINE)


def report(r, out, prefix):
    if r.has_table(PEAKS):
        t = Table(f"{r.name}: peak memory per phase", ["phase", header("peak", "MiB"), header("peak", "bytes")])
        for _, row in r.tables[PEAKS].iterrows():
            t.add(row["phase"], mib(row["peak_bytes"]), num(int(row["peak_bytes"]), "d"))
        out.table(f"{prefix}.memory_peaks", t)
    if r.has_table(TIMELINE):
        fig, (ax,) = figure()
        _plot(ax, r, r.name)
        ax.set_title(f"{r.name}: memory in use")
        out.figure(f"{prefix}.memory_timeline", fig)


def _plot(ax, r, label):
    tl = r.tables[TIMELINE]
    ax.step(tl["time_s"], tl["in_use_bytes"] / 2**20, where="post", label=label)
    ax.set(xlabel="time (s)", ylabel="in use (MiB)")
    ax.legend(fontsize="small")


def combine(results, keys, out, prefix):
    with_peaks = [r for r in results if r.has_table(PEAKS)]
    if with_peaks:
        phases = []
        for r in with_peaks:
            phases += [p for p in r.tables[PEAKS]["phase"] if p not in phases]
        t = Table("peak memory compared (MiB)", keys + phases, numeric=[False] * len(keys) + [True] * len(phases))
        for r in with_peaks:
            peaks = dict(zip(r.tables[PEAKS]["phase"], r.tables[PEAKS]["peak_bytes"]))
            t.add(*compare.key_cells(r, keys), *[mib(peaks.get(p)) for p in phases])
        out.table(f"{prefix}.memory_peaks", t)
    with_timeline = [r for r in results if r.has_table(TIMELINE)]
    if len(with_timeline) >= 2:
        fig, (ax,) = figure(width=8)
        for r in with_timeline:
            _plot(ax, r, compare.label(r, keys))
        ax.set_title("memory in use compared")
        out.figure(f"{prefix}.memory_timeline", fig)
