"""analysis.plan_sweep on a results file of run.job = plan (argv: LMSCALE SOURCE_DIR OUTDIR): the
sweep table has one row per (GPUs, family) for 1, 2, 4, 8 GPUs, the plot and the Markdown table
are written, and a file without the sweep is refused. Exit 77 without h5py, pandas or matplotlib
(unless LMSCALE_REQUIRE_ANALYSIS)."""
import os
import subprocess
import sys

try:
    import h5py  # noqa: F401
    import matplotlib  # noqa: F401
    import pandas  # noqa: F401
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(1 if os.environ.get("LMSCALE_REQUIRE_ANALYSIS") else 77)

from analysis import plan_sweep

lmscale, src, out = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
h5 = os.path.join(out, "plan.h5")
subprocess.run([lmscale, os.path.join(src, "inputs/fsdp_xl.ini"), "--run.job=plan", "--plan.gpus=2",
                "--plan.batch_size=8", "--plan.sweep_max_gpus=8", "--plan.search=false", f"--run.output={h5}"],
               cwd=src, check=True, stdout=subprocess.DEVNULL)
df, attrs = plan_sweep.load_sweep(h5)
assert sorted(set(df["gpus"])) == [1, 2, 4, 8], df
assert not df.duplicated(["gpus", "family"]).any(), "one row per family and GPU count"
assert (df["tokens_per_s_per_gpu"] > 0).all()
assert set(df[df["gpus"] == 1]["family"]) == {"one gpu"}, df[df["gpus"] == 1]
assert "fsdp" in set(df["family"])
png, md = plan_sweep.plot_sweep(h5, os.path.join(out, "plot"))
assert os.path.getsize(png) > 1000
lines = open(md).read().splitlines()
assert len(lines) == 2 + len(df), lines[:3]
no_sweep = os.path.join(out, "no_sweep.h5")
subprocess.run([lmscale, os.path.join(src, "inputs/fsdp_xl.ini"), "--run.job=plan", "--plan.gpus=2",
                "--plan.batch_size=8", "--plan.sweep_max_gpus=0", "--plan.search=false", f"--run.output={no_sweep}"],
               cwd=src, check=True, stdout=subprocess.DEVNULL)
try:
    plan_sweep.load_sweep(no_sweep)
    raise AssertionError("a file without /plan/sweep was accepted")
except SystemExit as e:
    assert "/plan/sweep" in str(e)
print("ok")
