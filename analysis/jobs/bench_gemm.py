"""bench-gemm: /bench_gemm/results, one row per (layer, pass, precision, variant) with the GEMM's
(M, N, K) and its median time and TFLOP/s; /bench_gemm/totals, the block totals per
(precision, variant): one dense block's GEMMs summed, the aggregate TFLOP/s over its shapes.

Tables: every row, and the totals. Combined: the totals of every file with the differing
configuration keys in front.
"""
from analysis import compare
from analysis.tables import Table, header, num

SECTION = "bench_gemm"
JOBS = {"bench-gemm"}
RESULTS = "/bench_gemm/results"
TOTALS = "/bench_gemm/totals"
# column -> (header, format); units come from the tables' `units` attribute.
# `accumulation` (fast, promoted, fp32, fp64: precision.fp8_fast_accum) is absent from files
# written before it; a missing column is left out.
ROW_COLUMNS = {"layer": ("layer", "s"), "pass": ("pass", "s"), "precision": ("precision", "s"),
               "variant": ("variant", "s"), "accumulation": ("accumulation", "s"), "group": ("group", "d"),
               "m": ("M", "d"), "n": ("N", "d"), "k": ("K", "d"), "time_ms": ("time", ".4f"),
               "tflops": ("rate", "rate")}
TOTAL_COLUMNS = {"precision": ("precision", "s"), "variant": ("variant", "s"), "gemms": ("GEMMs", "d"),
                 "time_ms": ("block time", ".4f"), "tflops": ("block rate", "rate")}
TEXT = {"layer", "pass", "precision", "variant", "accumulation"}


def _rate(v):
    """TFLOP/s as the job prints them: whole numbers from 100 up, else three significant digits
    (a CPU's 0.0123 does not show as 0.0)."""
    return num(v, ".0f") if abs(v) >= 100 else num(v, ".3g")


def _cell(row, c, spec):
    if c in TEXT:
        return str(row[c])
    return _rate(row[c]) if spec == "rate" else num(row[c], spec)


def present(r):
    return r.has_table(RESULTS)


def _table(title, results, keys, path, columns):
    cols = [c for c in columns if c in results[0].tables[path]]
    heads = [header(columns[c][0], results[0].unit(path, c)) for c in cols]
    t = Table(title, keys + heads, numeric=[False] * len(keys) + [c not in TEXT for c in cols])
    for r in results:
        for _, row in r.tables[path].iterrows():
            t.add(*compare.key_cells(r, keys),
                  *[_cell(row, c, columns[c][1]) for c in cols])
    return t


def report(r, out, prefix):
    out.table(f"{prefix}.bench_gemm", _table(f"{r.name}: GEMMs", [r], [], RESULTS, ROW_COLUMNS))
    if r.has_table(TOTALS):
        out.table(f"{prefix}.bench_gemm_totals",
                  _table(f"{r.name}: one block's GEMMs (LM head excluded)", [r], [], TOTALS, TOTAL_COLUMNS))


def combine(results, keys, out, prefix):
    with_totals = [r for r in results if r.has_table(TOTALS)]
    if with_totals:
        out.table(f"{prefix}.bench_gemm_totals",
                  _table("GEMM block totals compared", with_totals, keys, TOTALS, TOTAL_COLUMNS))
