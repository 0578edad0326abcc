#!/usr/bin/env python3
"""check_real.py OUTDIR: checks OUTDIR/report (analysis.report of train.h5, bench_b2.h5 and
bench_b4.h5 written by lmscale, see run_real.sh) against the HDF5 files read here with h5py:
the numbers the tables print must be the files' numbers, rounded as printed."""
import configparser
import os
import sys

from mdtable import Checker, check_png, find_row, read_table, require_modules

require_modules()
import h5py  # noqa: E402


def text(v):
    return v.decode().rstrip("\0") if isinstance(v, bytes) else str(v)


def config_value(f, key):
    parser = configparser.RawConfigParser(strict=False)
    parser.read_string(text(f.attrs["config"]))
    section, name = key.split(".", 1)
    return parser.get(section, name)


def main():
    outdir = sys.argv[1]
    rep = os.path.join(outdir, "report")
    md = lambda name: read_table(os.path.join(rep, name + ".md"))  # noqa: E731
    c = Checker()

    with h5py.File(os.path.join(outdir, "train.h5"), "r") as f:
        attrs = f["/train"].attrs
        steps = f["/train/steps"][()]
        _, rows = md("train.train_summary")
        row = rows[0]
        c.eq("train steps", row["steps"], str(len(steps)))
        c.eq("train first loss", row["first loss"], f"{attrs['first_loss']:.4f}")
        c.eq("train final loss", row["final loss"], f"{attrs['final_loss']:.4f}")
        c.eq("train final loss is the last logged loss", f"{attrs['final_loss']:.4f}", f"{steps['loss'][-1]:.4f}")
        later = steps["step_ms"][1:]
        c.eq("train mean step time without step 0", row["step time (ms)"], f"{later.mean():.3f}")
        c.eq("train parameters", row["parameters"], str(int(attrs["parameters"])))
        _, rows = md("train.system")
        c.eq("train ranks", [r["host"] for r in rows], [text(h) for h in f["/system/ranks"]["host"]])
        for name in ("train.train_loss", "train.train_step_time"):
            c.run(name, check_png, os.path.join(rep, name + ".png"))

    head, combined = md("combined-bench-model.bench_model")
    c.true(f"combined bench-model shows bench.batch_size ({head})", "bench.batch_size" in head)
    for stem in ("bench_b2", "bench_b4"):
        with h5py.File(os.path.join(outdir, stem + ".h5"), "r") as f:
            g = f["/bench_model"].attrs
            c.eq(f"{stem} timed steps", len(f["/bench_model/steps"]), 2)
            _, rows = md(stem + ".bench_model_phases")
            for phase, shown in (("forward", "forward"), ("backward", "backward"), ("total", "step"),
                                 ("period", "period (wall)")):
                want = f"{g[phase + '_ms_mean']:.3f} ± {g[phase + '_ms_std']:.3f}"
                c.run(f"{stem} {phase}", lambda: c.eq(f"{stem} {phase}", find_row(rows, phase=shown)["mean ± std (ms)"],
                                                      want))
            _, rows = md(stem + ".bench_model_summary")
            c.eq(f"{stem} tokens/s", rows[0]["tokens/s"], f"{g['tokens_per_s']:.0f}")
            c.eq(f"{stem} batch", rows[0]["batch"], str(int(g["batch_size"])))
            batch = config_value(f, "bench.batch_size")
            c.run(f"combined {stem}", lambda: c.eq(
                f"combined {stem} step", find_row(combined, **{"bench.batch_size": batch})["step (ms)"],
                f"{g['total_ms_mean']:.3f} ± {g['total_ms_std']:.3f}"))
            if "/memory/peaks" in f:
                peaks = {text(p): int(b) for p, b in zip(f["/memory/peaks"]["phase"], f["/memory/peaks"]["peak_bytes"])}
                _, rows = md(stem + ".memory_peaks")
                c.eq(f"{stem} memory phases", [r["phase"] for r in rows], list(peaks))
                c.run(f"{stem} overall peak", lambda: c.eq(f"{stem} overall peak", find_row(rows, phase="overall")["peak (bytes)"],
                                                           str(peaks.get("overall"))))
            if "/memory/timeline" in f and len(f["/memory/timeline"]):
                c.run(f"{stem} timeline png", check_png, os.path.join(rep, stem + ".memory_timeline.png"))
            c.run(f"{stem} phases png", check_png, os.path.join(rep, stem + ".bench_model_phases.png"))
    c.run("combined png", check_png, os.path.join(rep, "combined-bench-model.bench_model.png"))
    c.exit()


if __name__ == "__main__":
    main()
