"""analysis.fp8_study on synthetic results files (argv: OUTDIR): three train runs (bf16, fp8
current, fp8 delayed; or the first two alone) and bench-model runs of xl, built with h5py in the results schema. The
figure is written, the table holds each run's final losses and ratio to bf16, the xl timing ratio
is printed, the exit status follows --max-ratio, and runs of different lengths are refused.
Written as pytest test functions (`pytest ctest/analysis/test_fp8_study.py` runs them with a
temporary folder); ctest runs the same functions through __main__. Exit 77 without h5py, pandas
or matplotlib (unless LMSCALE_REQUIRE_ANALYSIS)."""
import contextlib
import io
import os
import sys
import tempfile

try:
    import h5py
    import matplotlib  # noqa: F401
    import numpy as np
    import pandas  # noqa: F401
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(1 if os.environ.get("LMSCALE_REQUIRE_ANALYSIS") else 77)

from analysis import fp8_study

STEPS_COLUMNS = [("step", "i8"), ("loss", "f8")]


def make_train(path, precision, final, steps=20):
    """A train results file whose loss falls linearly from 5 to `final` (one row per step), with
    two evaluations; 512 tokens per step."""
    losses = np.linspace(5.0, final, steps)
    with h5py.File(path, "w") as f:
        f.attrs["schema"] = "lmscale-results/2"
        f.attrs["job"] = "train"
        f.attrs["config"] = f"[run]\njob = train\n\n[precision]\nmode = {precision}\n"
        rows = np.array([(s + 1, losses[s]) for s in range(steps)], dtype=np.dtype(STEPS_COLUMNS))
        f.create_dataset("/train/steps", data=rows, maxshape=(None,), chunks=True)
        ev = np.array([(steps // 2, losses[steps // 2] + 0.1), (steps, final + 0.1)], dtype=np.dtype(STEPS_COLUMNS))
        f.create_dataset("/train/eval", data=ev, maxshape=(None,), chunks=True)
        f["/train"].attrs["tokens_per_step"] = np.int64(512)
    return path


def make_bench(path, tokens_per_s):
    with h5py.File(path, "w") as f:
        f.attrs["schema"] = "lmscale-results/2"
        f.attrs["job"] = "bench-model"
        f.attrs["config"] = "[run]\njob = bench-model\n"
        f.create_group("/bench_model").attrs["tokens_per_s"] = float(tokens_per_s)
    return path


def run_study(args):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = fp8_study.main(args)
    return code, buf.getvalue()


def three_runs(d, current=2.02, delayed=2.03, steps=20):
    return [make_train(os.path.join(d, "bf16.h5"), "bf16", 2.0),
            make_train(os.path.join(d, "cur.h5"), "fp8", current, steps),
            make_train(os.path.join(d, "del.h5"), "fp8", delayed)]


def test_table_figure_and_ratios(tmp_path):
    d = str(tmp_path)
    xl_b = [make_bench(os.path.join(d, f"xb{i}.h5"), t) for i, t in enumerate((1000, 1010, 990))]
    xl_f = [make_bench(os.path.join(d, f"xf{i}.h5"), t) for i, t in enumerate((1500, 1490, 1600))]
    code, out = run_study(three_runs(d) + ["--out", os.path.join(d, "study"), "--xl-bf16", *xl_b, "--xl-fp8", *xl_f])
    assert code == 0, out
    assert os.path.getsize(os.path.join(d, "study", "loss.png")) > 0
    assert "| fp8 current | 2.0200 | 2.1200 | 1.0100 |" in out, out
    assert "| fp8 delayed | 2.0300 | 2.1300 | 1.0150 |" in out, out
    assert "| bf16 | 2.0000 | 2.1000 | 1.0000 |" in out, out
    assert "bf16 1000 tokens/s, fp8 1500 tokens/s, fp8 / bf16 = 1.500" in out, out


def test_exit_status_follows_the_bound(tmp_path):
    d = str(tmp_path)
    code, out = run_study(three_runs(d, delayed=2.1) + ["--out", os.path.join(d, "study")])
    assert code == 1, out   # 2.1 / 2.0 = 1.05 > 1.02
    code, _ = run_study(three_runs(d, delayed=2.1) + ["--out", os.path.join(d, "study"), "--max-ratio", "1.06"])
    assert code == 0


def test_two_runs_without_delayed(tmp_path):
    """The xl check trains bf16 and fp8 current only: two files are a study, the bound applies."""
    d = str(tmp_path)
    two = three_runs(d, current=2.02)[:2]
    code, out = run_study(two + ["--out", os.path.join(d, "study"), "--max-ratio", "1.015", "--title", "xl"])
    assert code == 0, out   # 2.02 / 2.0 = 1.010 <= 1.015
    assert "| fp8 current | 2.0200 | 2.1200 | 1.0100 |" in out, out
    assert "fp8 delayed" not in out, out
    assert os.path.getsize(os.path.join(d, "study", "loss.png")) > 0
    code, out = run_study(two + ["--out", os.path.join(d, "study"), "--max-ratio", "1.005"])
    assert code == 1, out


def test_runs_of_different_length_are_refused(tmp_path):
    d = str(tmp_path)
    try:
        run_study(three_runs(d, steps=10) + ["--out", os.path.join(d, "study")])
    except SystemExit as e:
        assert "equal tokens" in str(e)
    else:
        raise AssertionError("runs of different lengths were compared")


if __name__ == "__main__":
    import pathlib
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    for name, fn in sorted((n, f) for n, f in globals().items() if n.startswith("test_")):
        where = pathlib.Path(root) / name
        where.mkdir(parents=True, exist_ok=True)
        fn(where)
        print(f"ok  {name}")
