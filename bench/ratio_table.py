#!/usr/bin/env python3
"""One Markdown table of lmscale against the PyTorch peer, from the files of repeated runs.

  ratio_table.py [--title TEXT] --row LABEL UNIT LMSCALE PEER [--row ...]

LMSCALE is FILES::METRIC[::FILTER] over lmscale HDF5 outputs, one file per run:
  METRIC /group@attr             an attribute, e.g. /bench_model@total_ms_median, /bench_model@peak_bytes
  METRIC /group/table:column     a column of a results table, e.g. /bench_attention/results:time_ms;
                                 FILTER (col=value,...) must leave exactly one row
PEER is FILES::FIELD[::FILTER] over files of the peer's JSON lines (other lines are skipped),
  e.g. peer_*.jsonl::step_ms::mode=fsdp; FILTER must leave exactly one object per file.
FILES is a glob. UNIT is what the table shows (ms, us, s, GiB, bytes, GB/s, tokens/s); values are
converted from the unit their name says (..._bytes, ..._us, ..._ms..., ..._gib, ..._gbs).

Each side's value is the median over its files (runs); each file already holds that run's median
over its timed steps. The ratio is lmscale / peer: below 1 lmscale takes less time or memory;
for bandwidths (GB/s) and tokens/s above 1 is better for lmscale. A side whose files are missing or
hold no value (OOM, failed run) shows "-" and is counted in the runs column as missing.
"""
import argparse
import glob
import json
import math
import statistics
import sys

SCALE = {"bytes": 1.0, "GiB": 2.0**30, "us": 1e-3, "ms": 1.0, "s": 1e3, "GB/s": 1.0, "tokens/s": 1.0}
HIGHER_IS_BETTER = {"GB/s", "tokens/s"}


def unit_of(name):
    n = name.lower()
    for suffix, unit in (("_bytes", "bytes"), ("bytes", "bytes"), ("_gib", "GiB"), ("_gbs", "GB/s"),
                         ("tokens_per_s", "tokens/s")):
        if n.endswith(suffix):
            return unit
    if "_us" in n:
        return "us"
    if "_ms" in n or n.endswith("ms"):
        return "ms"
    if n.endswith("_s"):
        return "s"
    return None


def convert(value, source_unit, unit):
    if source_unit is None or source_unit == unit:
        return value
    if source_unit in ("bytes", "GiB") and unit in ("bytes", "GiB") or source_unit in ("us", "ms", "s") and unit in ("us", "ms", "s"):
        return value * SCALE[source_unit] / SCALE[unit]
    raise SystemExit(f"cannot show a value in {source_unit} as {unit}")


def parse_source(text):
    parts = text.split("::")
    if len(parts) not in (2, 3):
        raise SystemExit(f"'{text}': expected FILES::METRIC[::FILTER]")
    filt = {}
    if len(parts) == 3 and parts[2]:
        for kv in parts[2].split(","):
            k, _, v = kv.partition("=")
            filt[k.strip()] = v.strip()
    return parts[0], parts[1], filt


def matches(get, filt):
    for k, want in filt.items():
        have = get(k)
        if isinstance(have, bytes):
            have = have.decode()
        if isinstance(have, bool):
            have = str(have).lower()
        try:
            if float(have) == float(want):
                continue
        except (TypeError, ValueError):
            pass
        if str(have) != want:
            return False
    return True


def as_number(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None  # "OOM" and the like
    return x if math.isfinite(x) else None


def lmscale_value(path, metric, filt):
    import h5py
    with h5py.File(path, "r") as f:
        if "@" in metric:
            group, attr = metric.split("@", 1)
            if group not in f or attr not in f[group].attrs:
                raise SystemExit(f"{path}: no attribute {attr} on {group}")
            return as_number(f[group].attrs[attr]), attr
        table, column = metric.rsplit(":", 1)
        rows = f[table][()]
        names = rows.dtype.names
        hits = [r for r in rows if matches(lambda k: r[names.index(k)] if k in names else None, filt)]
        if len(hits) != 1:
            raise SystemExit(f"{path}: {len(hits)} rows of {table} match {filt}, need exactly one")
        status = hits[0][names.index("status")] if "status" in names else b"ok"
        status = status.decode() if isinstance(status, bytes) else str(status)
        return (as_number(hits[0][names.index(column)]) if status == "ok" else None), column


def peer_value(path, field, filt):
    hits = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("peer") == "torch" and matches(rec.get, filt):
                hits.append(rec)
    if len(hits) > 1:
        raise SystemExit(f"{path}: {len(hits)} peer objects match {filt}, need at most one")
    return (as_number(hits[0].get(field)) if hits else None), field


def side(source, unit, reader):
    pattern, metric, filt = parse_source(source)
    files = sorted(glob.glob(pattern))
    values = []
    for path in files:
        v, name = reader(path, metric, filt)
        if v is not None:
            values.append(convert(v, unit_of(name), unit))
    return values, len(files)


def fmt(x):
    if x is None:
        return "-"
    if x == 0 or 0.01 <= abs(x) < 1e6:
        return f"{x:.4g}" if abs(x) < 100 else f"{x:.1f}"
    return f"{x:.3e}"


def table(title, rows, out=sys.stdout):
    if title:
        print(f"### {title}\n", file=out)
    print("| case | unit | lmscale | peer | lmscale / peer | runs (lmscale, peer) |", file=out)
    print("| --- | --- | ---: | ---: | ---: | --- |", file=out)
    for label, unit, (lv, ln), (pv, pn) in rows:
        lm = statistics.median(lv) if lv else None
        pe = statistics.median(pv) if pv else None
        ratio = lm / pe if lm is not None and pe else None
        print(f"| {label} | {unit} | {fmt(lm)} | {fmt(pe)} | {fmt(ratio)} | {len(lv)}/{ln}, {len(pv)}/{pn} |", file=out)
    print("\nMedians over runs; ratio = lmscale / peer (below 1: lmscale faster or smaller, "
          "except for GB/s and tokens/s, where above 1 is better for lmscale).", file=out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--title", default="")
    p.add_argument("--row", nargs=4, action="append", required=True, metavar=("LABEL", "UNIT", "LMSCALE", "PEER"))
    a = p.parse_args(argv)
    rows = []
    for label, unit, lm, peer in a.row:
        if unit not in SCALE:
            raise SystemExit(f"unit '{unit}': one of {', '.join(SCALE)}")
        rows.append((label, unit, side(lm, unit, lmscale_value), side(peer, unit, peer_value)))
    table(a.title, rows)


if __name__ == "__main__":
    main()
