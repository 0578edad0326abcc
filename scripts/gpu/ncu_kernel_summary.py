#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log per kernel name: the kernels of one
timed step, largest total first, and the step's kernel time. Usage: ncu_kernel_summary.py LOG.csv"""
import csv
import re
import sys

SCALE = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}


def short(name):
    """The kernel's name without its template arguments and parameter list."""
    name = re.sub(r"\(.*$", "", name)
    depth, out = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip()[:90]


def main(path):
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print("ncu summary: no CSV header in", path)
        return
    rows = [r for r in csv.DictReader(lines[start:]) if r.get("Metric Name") == "gpu__time_duration.sum"]
    total, per = 0.0, {}
    for r in rows:
        ms = float(r["Metric Value"].replace(",", "")) * SCALE.get(r["Metric Unit"], 1e-6)
        total += ms
        k = short(r["Kernel Name"])
        n, t = per.get(k, (0, 0.0))
        per[k] = (n + 1, t + ms)
    print(f"ncu: {len(rows)} kernels, {total:.2f} ms of kernel time in the profiled step")
    for k, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"  {t:8.2f} ms {100 * t / total:5.1f}% {n:5d}x {1e3 * t / n:8.1f} us  {k}")


if __name__ == "__main__":
    main(sys.argv[1])
