#!/usr/bin/env python3
"""lmscale results -> tables and plots.

    python3 -m analysis.report FILE.h5 [FILE2.h5 ...] --out DIR [--format md,tex,png] [--vs KEY]

Files that are not results files (weights, checkpoints, traces: by the root attribute `schema`)
are skipped with one note, so `outputs/*` may be given. For each results file, per section found
(train, bench-model, bench-attention, bench-collectives, accounting, prune, memory, system ranks): Markdown (NAME.md) and LaTeX (NAME.tex, a booktabs tabular) tables and PNG plots,
named FILESTEM.TABLE.*. When several files of one job are given, also one comparison per section
(combined-JOB.TABLE.*) whose first columns are the configuration keys that differ between the
files. With --vs KEY (e.g. bench.batch_size), the bench-model files also get a study against that
key: tokens/s and peak memory per run, one line per combination of the other differing keys
(vs-KEY.bench_model.*). DIR/index.md collects every table and plot. Exit status: 0, 1 if a file could not be
read, 2 on bad arguments.
"""
import argparse
import os
import sys

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    from analysis import compare, h5load  # noqa: E402
except ImportError as e:  # h5py, pandas or matplotlib missing
    sys.exit(f"analysis.report: {e}; install them with: python3 -m pip install -r analysis/requirements.txt")
from analysis.jobs import KNOWN_JOBS, MODULES  # noqa: E402
from analysis.output import Output  # noqa: E402
from analysis.tables import Table  # noqa: E402

FORMATS = {"md", "tex", "png"}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python3 -m analysis.report", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", metavar="FILE.h5",
                   help="lmscale results files (schemas lmscale-results/1 and /2); other files given (weights, "
                        "checkpoints, traces) are skipped with one note")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument("--format", default="md,tex,png", help="comma-separated subset of md,tex,png (default: all)")
    p.add_argument("--vs", metavar="KEY", help="bench-model: tokens/s and peak memory against this deck key")
    args = p.parse_args(argv)
    args.formats = [f.strip() for f in args.format.split(",") if f.strip()]
    bad = set(args.formats) - FORMATS
    if bad or not args.formats:
        p.error(f"--format: unknown {', '.join(sorted(bad)) or 'empty list'}; use md, tex, png")
    missing = [f for f in args.files if not os.path.isfile(f)]
    if missing:
        p.error("no such file: " + ", ".join(missing))
    return args


def unique_prefixes(results):
    """File stems, made unique (run, run-2, ...) when files from different folders share a name."""
    seen, out = {}, []
    for r in results:
        n = seen.get(r.name, 0) + 1
        seen[r.name] = n
        out.append(r.name if n == 1 else f"{r.name}-{n}")
    return out


def main(argv=None):
    args = parse_args(argv)
    out = Output(args.out, args.formats)
    status = 0
    results, skipped = [], []
    for path in args.files:
        kind = h5load.file_kind(path)
        if kind != "results":
            skipped.append(f"{path} ({kind})")
            continue
        try:
            results.append(h5load.load(path))
        except (OSError, KeyError, ValueError) as e:
            print(f"analysis.report: cannot read {path}: {e}", file=sys.stderr)
            status = 1
    if skipped:
        note = f"skipped {len(skipped)} file(s) that are not results files: {', '.join(skipped)}"
        print(f"analysis.report: {note}", file=sys.stderr)

    files = Table("files", ["file", "job", "schema", "git commit", "UTC time", "world size"],
                  numeric=[False] * 5 + [True])
    for r in results:
        files.add(r.path, r.job, r.attrs.get("schema", ""), r.attrs.get("git_commit", ""),
                  r.attrs.get("utc_time", ""), r.attrs.get("world_size", ""))
    out.sections.append(("files", files.to_markdown()))
    if skipped:
        out.note(f"*{note}.*")

    for r, prefix in zip(results, unique_prefixes(results)):
        out.sections.append((f"## {r.name} ({r.job})", ""))
        if r.job not in KNOWN_JOBS:
            out.note(f"*{r.path}: job {r.job!r} has no analysis; only its system and memory tables are shown.*")
        for module in MODULES:
            if (not module.JOBS or r.job in module.JOBS) and module.present(r):
                guarded(out, module, r.path, module.report, r, out, prefix)

    for job in sorted({r.job for r in results} & KNOWN_JOBS):
        same = [r for r in results if r.job == job]
        if len(same) < 2:
            continue
        keys = compare.differing_keys(same)
        out.sections.append((f"## {job}: {len(same)} files compared", f"Differing configuration keys: "
                             f"{', '.join(keys) if keys else '(none)'}\n"))
        for module in MODULES:
            if module.JOBS and job not in module.JOBS:
                continue
            present = [r for r in same if module.present(r)]
            if len(present) >= 2:
                keys = compare.differing_keys(present)
                guarded(out, module, job, module.combine, compare.sorted_by_keys(present, keys), keys, out,
                        f"combined-{job}")

    if args.vs:
        from analysis.jobs import bench_model
        runs = [r for r in results if r.job == "bench-model"]
        if not runs or not all(args.vs in r.config for r in runs):
            print(f"analysis.report: --vs {args.vs}: no bench-model files with that key", file=sys.stderr)
            status = 2
        else:
            out.sections.append((f"## bench-model against {args.vs}", ""))
            guarded(out, bench_model, "bench-model", bench_model.versus, runs, args.vs, out, f"vs-{args.vs}")

    write_index(out)
    for name in out.written:
        print(os.path.join(args.out, name))
    return status


def guarded(out, module, what, fn, *args):
    """Runs one section; a table without a column the section needs (a file from an older or newer
    lmscale) skips that section with a note instead of ending the report."""
    try:
        fn(*args)
    except KeyError as e:
        msg = f"{what}: section {module.SECTION} skipped, column or attribute {e} missing"
        print(f"analysis.report: {msg}", file=sys.stderr)
        out.note(f"*{msg}.*")


def write_index(out):
    parts = ["# lmscale report\n"]
    for heading, text in out.sections:
        if heading and heading.startswith("#"):
            parts.append(heading + "\n")
        elif heading:
            parts.append(f"### {heading}\n")
        if text:
            parts.append(text)
    with open(os.path.join(out.folder, "index.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    out.written.append("index.md")


if __name__ == "__main__":
    sys.exit(main())
