#!/usr/bin/env python3
"""nccl_tests_format.py LMSCALE OUTDIR: bench.format = nccl-tests, read the way nccl-tests' users read it.

Runs bench-collectives on 2 CPU ranks (MPI backend) with the five collectives at 4 sizes and parses
stdout as the scripts written for NVIDIA's nccl-tests do:
  - rows: lines not starting with '#' matched by the 13-field regex of such parsers
    (size count type redop root, then time algbw busbw #wrong out of place and in place);
  - the average: `grep "# Avg bus bandwidth" | awk '{print $NF}'`, and `Avg bus bandwidth\\s*:\\s*([\\d.]+)`;
  - the header: nccl-tests' three header lines, character for character (printf formats of its
    src/common.cu Reporter), and every row equal to its own fields printed with nccl-tests' formats.
Then the values: nccl-tests' count (all-gather: the send count, reduce-scatter: the receive
count), type float, redop sum/none, root -1/0, no wrong elements, busbw = algbw x the op's factor,
and each table's average equal to the mean busbw of its rows' two columns. The HDF5 table holds
both placements of every size.
"""
import re, shutil, subprocess, sys

lmscale, out = sys.argv[1:3]
failures = []


def check(what, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + what + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(what)


if not shutil.which("mpirun"):
    print("mpirun not found: skipped")
    sys.exit(77)
sizes = [1024, 4096, 16384, 65536]
ops = ["all-reduce", "reduce-scatter", "all-gather", "broadcast", "all-to-all"]
run = subprocess.run(["mpirun", "-np", "2", "--bind-to", "none", lmscale, "--run.job=bench-collectives",
                      "--parallel.device=cpu", "--bench.format=nccl-tests", f"--bench.ops={','.join(ops)}",
                      "--bench.dtypes=fp32", "--bench.min_bytes=1K", "--bench.max_bytes=64K", "--bench.step_factor=4",
                      "--bench.warmup=1", "--bench.steps=3", f"--run.output={out}/nccl_tests.h5"],
                     capture_output=True, text=True)
check("bench-collectives exits 0", run.returncode == 0, run.stderr[-600:])
text = run.stdout
print(text)

# nccl-tests' header (src/common.cu, Reporter::Reporter), printed by C's printf.
header = ["# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          " % ("", "", "", "", ""),
          "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s" % (
              "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
              "#wrong"),
          "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s" % (
              "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")]
lines = text.splitlines()
starts = [i for i in range(len(lines) - 2) if lines[i:i + 3] == header]
check("one nccl-tests header per collective", len(starts) == len(ops), f"{len(starts)} headers")
check("the preamble of nccl-tests", re.search(r"^# nThread 1 nGpus 1 minBytes 1024 maxBytes 65536 step: 4\(factor\) "
                                               r"warmup iters: 1 iters: 3 agg iters: 1 validation: 1 graph: 0$", text, re.M)
      is not None and len(re.findall(r"^#  Rank +\d+ Group +0 Pid +\d+ on +\S+ device +\d+ \[0x[0-9a-f]{2}\] ", text, re.M)) == 2)

# The row regex of nccl-tests parsers (13 fields).
row_re = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)"
                    r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s*$")
tables, current, open_table = [], None, False   # lines outside a table (lmscale's own) are not rows
for line in lines:
    if line == header[0]:
        current = {"rows": [], "avg": None}
        tables.append(current)
        open_table = True
    elif line.startswith("# Avg bus bandwidth") and current is not None:
        open_table = False
        current["avg"] = float(line.split()[-1])            # awk '{print $NF}'
        m = re.search(r"Avg bus bandwidth\s*:\s*([\d.]+)", line)
        check("the average parses with the regex too", m is not None and float(m.group(1)) == current["avg"], line)
    elif not line.startswith("#") and open_table and line.strip():
        m = row_re.match(line)
        check(f"row parses: {line!r}", m is not None)
        if m:
            g = m.groups()
            current["rows"].append(g)
            # The line is its fields in nccl-tests' printf formats (Reporter::parameters, ::result).
            again = "%12i  %12i  %8s  %6s  %6i" % (int(g[0]), int(g[1]), g[2], g[3], int(g[4])) + "".join(
                "  %7s  %6.2f  %6.2f  %5i" % (g[5 + 4 * k], float(g[6 + 4 * k]), float(g[7 + 4 * k]), int(g[8 + 4 * k]))
                for k in range(2))
            check(f"row layout is nccl-tests': {line!r}", again == line, repr(again))
check("a table per collective", len(tables) == len(ops), str(len(tables)))
factor = {"all-reduce": 2 * (2 - 1) / 2, "reduce-scatter": 0.5, "all-gather": 0.5, "broadcast": 1.0, "all-to-all": 0.5}
for op, table in zip(ops, tables):
    rows = table["rows"]
    check(f"{op}: one row per size", [int(r[0]) for r in rows] == sizes, str([r[0] for r in rows]))
    for r in rows:
        size, count = int(r[0]), int(r[1])
        want_count = size // 4 // 2 if op in ("all-gather", "reduce-scatter", "all-to-all") else size // 4
        want_redop = "sum" if op in ("all-reduce", "reduce-scatter") else "none"
        want_root = 0 if op == "broadcast" else -1
        check(f"{op} {size}: count, type, redop, root as nccl-tests",
              (count, r[2], r[3], int(r[4])) == (want_count, "float", want_redop, want_root), str(r[:5]))
        check(f"{op} {size}: no wrong elements", r[8] == "0" and r[12] == "0", f"{r[8]} {r[12]}")
        for k in range(2):
            t, alg, bus = float(r[5 + 4 * k]), float(r[6 + 4 * k]), float(r[7 + 4 * k])
            check(f"{op} {size}: algbw = size / time", abs(alg - size / (t * 1e-6) / 1e9) <= 0.006 + 0.01 * alg,
                  f"{alg} vs {size / (t * 1e-6) / 1e9}")
            check(f"{op} {size}: busbw = algbw x {factor[op]}", abs(bus - alg * factor[op]) <= 0.011, f"{bus} {alg}")
    busbws = [float(r[7]) for r in rows] + [float(r[11]) for r in rows]
    mean = sum(busbws) / len(busbws) if busbws else -1
    check(f"{op}: '# Avg bus bandwidth' is the mean busbw of both columns",
          table["avg"] is not None and abs(table["avg"] - mean) <= 0.006, f"{table['avg']} vs {mean}")
    check(f"{op}: '# Out of bounds values : 0 OK'", "# Out of bounds values : 0 OK" in text)

try:
    import h5py
    rows = h5py.File(f"{out}/nccl_tests.h5", "r")["/bench_collectives/results"][:]
    placements = {}
    for r in rows:
        op = r["op"].decode().rstrip("\0") if isinstance(r["op"], bytes) else str(r["op"])
        placements.setdefault(op, set()).add((int(r["bytes"]), int(r["inplace"])))
    one = {"broadcast": (1,), "all-to-all": (0,)}   # their one placement, shown in both columns
    check("HDF5: both placements of every size (broadcast: in place; all-to-all: out of place)",
          all(placements.get(op) == {(s, ip) for s in sizes for ip in one.get(op, (0, 1))}
              for op in ops), str(placements))
except ImportError:
    print("h5py not installed: the HDF5 check is skipped")

print("PASS" if not failures else f"FAIL ({len(failures)})")
sys.exit(1 if failures else 0)
