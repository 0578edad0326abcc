#!/usr/bin/env python3
"""ctest analysis.synthetic: builds small results files in the lmscale-results/1 schema with
h5py (compound tables with fixed-length byte strings and a `units` attribute, root and group
attributes) for every job type, runs analysis.report on them and checks the generated tables'
numbers, the OOM marks, the combined tables' differing keys, and the PNG files.

    test_report.py [WORKDIR]      (exit 0 pass, 1 fail, 77 skipped: packages missing)
"""
import math
import os
import shutil
import subprocess
import sys
import tempfile

from mdtable import Checker, check_png, find_row, read_table, require_modules

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
require_modules()
import h5py  # noqa: E402
import numpy as np  # noqa: E402

I, F, S = "i8", "f8", "S64"   # the C++ writer's column types: int64, float64, 64-byte strings


def write_table(f, path, columns, rows):
    """columns: [(name, type, unit)], rows: tuples. Chunked, extendible, like io/results.cpp."""
    dtype = np.dtype([(n, t) for n, t, _ in columns])
    data = np.array([tuple(r) for r in rows], dtype=dtype)
    ds = f.create_dataset(path, data=data, maxshape=(None,), chunks=True)
    ds.attrs.create("units", np.array([u.encode() for _, _, u in columns], dtype="S16"))


def new_file(path, job, extra_config, world_size=1, job_attr=True):
    """A results file with root attributes and /system/ranks; job_attr=False leaves out the root
    attribute `job` (the job then comes from run.job of `config`)."""
    config = {"run.job": job, "run.output": path, "run.seed": "42", "model.d_model": "32",
              "precision.mode": "fp32", "parallel.device": "cpu"}
    config.update(extra_config)
    sections = {}
    for key, value in config.items():
        section, name = key.split(".", 1)
        sections.setdefault(section, []).append(f"{name} = {value}" if value else f"{name} =")
    ini = "# lmscale resolved configuration\n" + "".join(
        f"\n[{s}]\n" + "\n".join(lines) + "\n" for s, lines in sections.items())
    f = h5py.File(path, "w")
    for k, v in {"schema": "lmscale-results/1", "version": "0.1.0", "git_commit": "abc1234",
                 "utc_time": "2025-11-22T07:00:00Z", "command_line": f"lmscale deck.ini --run.output={path}",
                 "deck": "[run]\njob = " + job + "\n", "config": ini}.items():
        f.attrs[k] = v
    f.attrs["world_size"] = np.int64(world_size)
    if job_attr:
        f.attrs["job"] = job
    write_table(f, "/system/ranks", [("rank", I, ""), ("host", S, ""), ("local_rank", I, ""), ("device", S, ""),
                                     ("device_name", S, ""), ("mpi", S, ""), ("hdf5", S, ""), ("nccl", S, ""),
                                     ("cuda", S, ""), ("blas", S, "")],
                [(r, f"node{r}".encode(), r, b"cpu", b"cpu", b"Open MPI 4.1", b"1.10.8", b"none", b"none", b"OpenBLAS")
                 for r in range(world_size)])
    return f


TRAIN_COLUMNS = [("step", I, ""), ("loss", F, "nats"), ("lr", F, ""), ("grad_norm", F, ""), ("step_ms", F, "ms"),
                 ("forward_ms", F, "ms"), ("backward_ms", F, "ms"), ("comm_ms", F, "ms"), ("optimizer_ms", F, "ms"),
                 ("tokens_per_s", F, "1/s"), ("loss_scale", F, ""), ("skipped", I, ""), ("memory_bytes", I, "bytes")]
STEP_MS = [500.0, 10, 11, 12, 13, 14, 15, 16, 17, 18]          # mean without step 0: 14.0


def make_train(path, lr, losses, with_summary):
    # Output paths differ between the two runs too: they never count as differing keys.
    outputs = {"run.trace": f"trace_{lr}.json", "train.save": f"w_{lr}.safetensors",
               "train.checkpoint_path": f"ck_{lr}.h5", "train.checkpoint_dir": f"ck_{lr}"}
    with new_file(path, "train", {"optim.lr": lr, **outputs}, world_size=2, job_attr=with_summary) as f:
        rows = [(s, losses[s], float(lr), 1.0, STEP_MS[s], 200.0 if s == 0 else 4.0, 5.0, 0.5, 0.25,
                 100.0 if s == 0 else 2000.0, 1.0, 0, 1 << 20) for s in range(len(losses))]
        write_table(f, "/train/steps", TRAIN_COLUMNS, rows)
        if with_summary:
            write_table(f, "/train/eval", [("step", I, ""), ("loss", F, "nats")], [(4, 3.1), (9, 2.5)])
            f["/train"].attrs.update({"first_loss": losses[0], "final_loss": losses[-1],
                                      "parameters": np.int64(12345), "wall_s": 1.234})
            write_table(f, "/memory/peaks", [("phase", S, ""), ("peak_bytes", I, "bytes")],
                        [(b"init", 1 << 20), (b"forward", 5 << 19), (b"overall", 3 << 20)])


def make_bench_model(path, size, stats, steps_forward, mfu):
    cols = [("step", I, ""), ("forward_ms", F, "ms"), ("backward_ms", F, "ms"), ("comm_ms", F, "ms"),
            ("optimizer_ms", F, "ms"), ("total_ms", F, "ms"), ("loss", F, "nats")]
    with new_file(path, "bench-model", {"model.size": size, "bench.mode": "forward-backward"}) as f:
        write_table(f, "/bench_model/steps", cols,
                    [(i, fw, 2 * fw, 0.0, 0.0, 3 * fw, 9.2) for i, fw in enumerate(steps_forward)])
        g = f["/bench_model"]
        for phase, (mean, std) in stats.items():   # phases without stats: computed from the table
            g.attrs.update({f"{phase}_ms_mean": mean, f"{phase}_ms_std": std, f"{phase}_ms_min": mean - std,
                            f"{phase}_ms_max": mean + std, f"{phase}_ms_median": mean})
        g.attrs.update({"mode": "forward-backward", "precision": "bf16", "batch_size": np.int64(4),
                        "context_length": np.int64(256), "parameters": np.int64(128_000_000),
                        "tokens_per_s": 51200.4, "flops_per_step": 1e12, "achieved_flops": 1.5e14,
                        "peak_flops": 3.7e14, "mfu": mfu, "peak_bytes": np.int64(3 << 30), "device_name": "Test GPU"})
        if stats:
            write_table(f, "/memory/peaks", [("phase", S, ""), ("peak_bytes", I, "bytes")],
                        [(b"init", 1 << 30), (b"forward", 3 << 30), (b"overall", 3 << 30)])
            g.attrs.update({"moe_expert_rows_max_over_mean": 1.4567, "moe_ep_rank_rows_max_over_mean": 1.2345})
            # Two relabellings of 2 MoE blocks (parallel.ep_rebalance_every): the second moves nothing in layer 1.
            write_table(f, "/bench_model/ep_placement",
                        [("step", I, ""), ("layer", I, ""), ("moved", I, "experts"), ("busiest_rank_before", F, ""),
                         ("busiest_rank_after", F, ""), ("seconds", F, "s")] + [(f"origin_{e}", I, "") for e in range(4)],
                        [(10, 0, 2, 1.30, 1.02, 0.5, 2, 1, 0, 3), (10, 1, 2, 1.10, 1.00, 0.25, 0, 3, 2, 1),
                         (20, 0, 2, 1.20, 1.04, 0.5, 0, 1, 2, 3), (20, 1, 0, 1.01, 1.01, 0.0, 0, 3, 2, 1)])
            write_table(f, "/memory/timeline", [("time_s", F, "s"), ("delta_bytes", I, "bytes"),
                                                ("in_use_bytes", I, "bytes"), ("tag", S, "")],
                        [(0.0, 1 << 30, 1 << 30, b"params"), (0.5, 2 << 30, 3 << 30, b"activations"),
                         (0.9, -(2 << 30), 1 << 30, b"free")])


def attention_time(impl, seq, head_dim):
    return seq / 100 * (2 if impl == "naive" else 1) * head_dim / 64


def make_attention(path):
    cols = [("impl", S, ""), ("pass", S, ""), ("dtype", S, ""), ("causal", I, ""), ("batch", I, ""),
            ("heads", I, ""), ("seq", I, ""), ("head_dim", I, ""), ("time_ms", F, "ms"), ("time_ms_min", F, "ms"),
            ("time_ms_max", F, "ms"), ("tflops", F, "TFLOP/s"), ("mem_before_backward_bytes", I, "bytes"),
            ("status", S, "")]
    rows = []
    for impl in (b"naive", b"flash"):
        for head_dim in (64, 128):
            for seq in (256, 512, 1024):
                if impl == b"naive" and seq == 1024 and head_dim == 128:
                    rows.append((impl, b"forward", b"bf16", 1, 4, 16, seq, head_dim, math.nan, math.nan, math.nan,
                                 math.nan, 0, b"OOM"))
                    continue
                t = attention_time(impl.decode(), seq, head_dim)
                rows.append((impl, b"forward", b"bf16", 1, 4, 16, seq, head_dim, t, 0.9 * t, 1.1 * t, 1.0 / t,
                             seq * seq * 64, b"ok"))
    with new_file(path, "bench-attention", {}) as f:
        write_table(f, "/bench_attention/results", cols, rows)


def make_collectives(path):
    cols = [("op", S, ""), ("backend", S, ""), ("algo", S, ""), ("dtype", S, ""), ("ranks", I, ""), ("bytes", I, "B"),
            ("count", I, ""), ("inplace", I, ""), ("time_us_avg", F, "us"), ("time_us_min", F, "us"),
            ("time_us_max", F, "us"), ("algbw_gbs", F, "GB/s"), ("busbw_gbs", F, "GB/s"), ("errors", I, "")]
    rows = []
    for backend in (b"mpi", b"nccl"):
        for ranks in (2, 4):
            for size in (1024, 16384, 262144, 1048576):
                bus = 123.456 if (backend, ranks, size) == (b"nccl", 4, 1048576) else size / 1e4 / ranks
                rows.append((b"all_reduce", backend, b"ring", b"float32", ranks, size, size // 4, 0,
                             10.0 + size / 1e4, 9.0, 11.0, bus / 1.5, bus, 0))
    with new_file(path, "bench-collectives", {"parallel.backend": "auto"}, world_size=4) as f:
        write_table(f, "/bench_collectives/results", cols, rows)


def make_gemm(path):
    cols = [("layer", S, ""), ("pass", S, ""), ("precision", S, ""), ("variant", S, ""), ("accumulation", S, ""),
            ("group", I, ""), ("m", I, ""), ("n", I, ""), ("k", I, ""), ("flops", F, "FLOP"), ("time_ms", F, "ms"),
            ("time_ms_min", F, "ms"), ("time_ms_max", F, "ms"), ("tflops", F, "TFLOP/s"), ("in_block", I, "bool")]
    rows = [(b"qkv", b"forward", b"fp8", b"gemm", b"fast", 3, 8192, 1600, 1600, 1.2583e12, 1.0, 0.9, 1.1, 1258.3, 1),
            (b"qkv", b"forward", b"fp8", b"gemm+casts", b"fast", 3, 8192, 1600, 1600, 1.2583e12, 1.25, 1.2, 1.3,
             1006.6, 1)]
    with new_file(path, "bench-gemm", {}) as f:
        write_table(f, "/bench_gemm/results", cols, rows)
        write_table(f, "/bench_gemm/totals", [("precision", S, ""), ("variant", S, ""), ("gemms", I, ""),
                                              ("flops", F, "FLOP"), ("time_ms", F, "ms"), ("tflops", F, "TFLOP/s")],
                    [(b"fp8", b"gemm", 12, 1.2e13, 9.0, 1333.3), (b"fp8", b"gemm+casts", 12, 1.2e13, 12.5, 960.0)])


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="lmscale-analysis-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    h5 = {n: os.path.join(work, n + ".h5") for n in
          ("train_a", "train_b", "bench_small", "bench_medium", "attention", "collectives", "accounting", "gemm")}
    losses_a = [4.6, 4.2, 3.9, 3.5, 3.3, 3.0, 2.8, 2.6, 2.45, 2.345678]
    losses_b = [4.5, 4.0, 3.6, 3.2, 2.9, 2.7, 2.5, 2.3, 2.2, 2.11111]
    make_train(h5["train_a"], "0.01", losses_a, with_summary=True)
    make_train(h5["train_b"], "0.02", losses_b, with_summary=False)
    make_bench_model(h5["bench_small"], "small", {"forward": (12.3456, 0.5), "backward": (25.0, 1.0),
                                                  "total": (40.0, 1.5), "comm": (0.0, 0.0), "optimizer": (0.0, 0.0)},
                     [12.0, 12.5], 0.41)
    make_bench_model(h5["bench_medium"], "medium", {}, [29.0, 31.0], math.nan)
    make_attention(h5["attention"])
    make_collectives(h5["collectives"])
    make_gemm(h5["gemm"])
    with new_file(h5["accounting"], "accounting", {}) as f:
        f.create_group("/accounting").attrs.update({"parameters": np.int64(7), "peak_bytes_per_rank": 3.0 * 2**20,
                                                    "comm_formula": "2 (n-1)/n x 4P", "run_refused": ""})
        write_table(f, "/accounting/memory", [("component", S, ""), ("bytes", F, "bytes"), ("formula", S, "")],
                    [(b"parameters", 2.0 * 2**20, b"4 B x P"), (b"gradients", 2**20, b"4 B x P")])
        write_table(f, "/accounting/cost", [("item", S, ""), ("hours", F, "h"), ("gpu_hours", F, "h"),
                                            ("cost", F, "currency"), ("formula", S, "")],
                    [(b"compute", 1.5, 12.0, 24.0, b"D x F / (g x peak x MFU)"), (b"total", 1.5, 12.0, 24.0, b"sum")])
        f["/accounting/cost"].attrs["tokens"] = 1e9
    # Not results files: a weights file, a safetensors file, a trace; skipped with one note.
    others = [os.path.join(work, n) for n in ("weights.h5", "weights.safetensors", "trace.json")]
    with h5py.File(others[0], "w") as f:
        f.attrs["schema"] = "lmscale-checkpoint/1"
        f["lm_head.weight"] = np.zeros((2, 2), dtype=np.float32)
    with open(others[1], "wb") as f:
        f.write((2).to_bytes(8, "little") + b"{}")
    with open(others[2], "w", encoding="utf-8") as f:
        f.write('{"traceEvents": []}')

    out = os.path.join(work, "report")
    env = dict(os.environ, PYTHONPATH=REPO, MPLBACKEND="Agg")
    cmd = [sys.executable, "-m", "analysis.report", *h5.values(), *others, "--out", out]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    print(proc.stdout, proc.stderr, sep="\n")
    c = Checker()
    c.eq("report exit status", proc.returncode, 0)
    if proc.returncode != 0:
        c.exit()
    md = lambda name: read_table(os.path.join(out, name + ".md"))  # noqa: E731

    # train: summary of one file; the mean step time leaves the first (setup) step out.
    _, rows = md("train_a.train_summary")
    c.eq("train_a rows", len(rows), 1)
    row = rows[0]
    c.eq("train_a steps", row["steps"], "10")
    c.eq("train_a first loss", row["first loss"], "4.6000")
    c.eq("train_a final loss", row["final loss"], "2.3457")
    c.eq("train_a eval loss", row["final eval loss"], "2.5000")
    c.eq("train_a step time", row["step time (ms)"], "14.000")
    c.eq("train_a tokens/s", row["tokens/s"], "2000")
    c.eq("train_a parameters", row["parameters"], "12345")
    _, rows = md("train_a.train_phases")
    c.eq("train_a forward phase", find_row(rows, phase="forward")["mean ± std (ms)"], "4.000 ± 0.000")
    c.eq("train_a step phase max", find_row(rows, phase="step")["max (ms)"], "18.000")
    _, rows = md("train_b.train_summary")  # no attributes, no eval: taken from /train/steps
    c.eq("train_b final loss", rows[0]["final loss"], "2.1111")
    c.eq("train_b eval loss", rows[0]["final eval loss"], "")
    head, rows = md("combined-train.train")
    c.eq("combined train: differing keys first", head[0], "optim.lr")
    for key in ("run.output", "run.trace", "train.save", "train.checkpoint_path", "train.checkpoint_dir"):
        c.true(f"combined train: {key} is not a key", key not in head)
    c.run("combined train lr=0.01", lambda: c.eq("final loss lr 0.01",
                                                 find_row(rows, **{"optim.lr": "0.01"})["final loss"], "2.3457"))
    c.run("combined train lr=0.02", lambda: c.eq("final loss lr 0.02",
                                                 find_row(rows, **{"optim.lr": "0.02"})["final loss"], "2.1111"))

    # bench-model: attributes, or the steps table where a file has no summary attributes.
    _, rows = md("bench_small.bench_model_phases")
    c.eq("bench phases shown (forward-backward)", [r["phase"] for r in rows], ["forward", "backward", "step"])
    c.eq("bench forward", find_row(rows, phase="forward")["mean ± std (ms)"], "12.346 ± 0.500")
    c.eq("bench step median", find_row(rows, phase="step")["median (ms)"], "40.000")
    _, rows = md("bench_small.bench_model_summary")
    c.eq("bench tokens/s", rows[0]["tokens/s"], "51200")
    c.eq("bench MFU", rows[0]["MFU"], "41.0%")
    c.eq("bench peak memory", rows[0]["peak memory (MiB)"], "3072.0")
    c.eq("bench TFLOP/s", rows[0]["achieved (TFLOP/s)"], "150.000")
    _, rows = md("bench_small.bench_model_moe_balance")
    c.eq("bench MoE balance, expert", rows[0]["busiest expert / mean"], "1.457")
    c.eq("bench MoE balance, ep rank", rows[0]["busiest ep rank / mean"], "1.234")
    _, rows = md("bench_small.bench_model_ep_placement")
    c.eq("bench ep relabellings, steps", [x["after step"] for x in rows], ["10", "20"])
    c.eq("bench ep relabellings, blocks", [x["blocks relabelled"] for x in rows], ["2", "1"])
    c.eq("bench ep relabellings, experts", [x["experts moved"] for x in rows], ["4", "2"])
    c.eq("bench ep relabellings, before", [x["busiest rank before"] for x in rows], ["1.200", "1.105"])
    c.eq("bench ep relabellings, after", [x["busiest rank after"] for x in rows], ["1.010", "1.025"])
    c.eq("bench ep relabellings, seconds", [x["moves (s)"] for x in rows], ["0.75", "0.50"])
    c.true("a run without relabellings has no relabelling table",
           not os.path.exists(os.path.join(out, "bench_medium.bench_model_ep_placement.md")))
    c.true("a dense run has no MoE balance table",
           not os.path.exists(os.path.join(out, "bench_medium.bench_model_moe_balance.md")))
    _, rows = md("bench_medium.bench_model_summary")
    c.eq("bench medium MFU (NaN)", rows[0]["MFU"], "n/a")
    head, rows = md("combined-bench-model.bench_model")
    c.eq("combined bench-model key columns", head[:1], ["model.size"])
    c.eq("combined bench-model rows sorted by key", [r["model.size"] for r in rows], ["medium", "small"])
    c.run("combined bench small", lambda: c.eq("small forward", find_row(rows, **{"model.size": "small"})["forward (ms)"],
                                               "12.346 ± 0.500"))
    c.run("combined bench medium", lambda: c.eq("medium forward (from table)",
                                                find_row(rows, **{"model.size": "medium"})["forward (ms)"],
                                                "30.000 ± 1.000"))
    c.run("combined bench medium step", lambda: c.eq("medium step (from table)",
                                                     find_row(rows, **{"model.size": "medium"})["step (ms)"],
                                                     "90.000 ± 3.000"))

    # memory
    _, rows = md("bench_small.memory_peaks")
    c.eq("memory overall", find_row(rows, phase="overall")["peak (MiB)"], "3072.0")
    _, rows = md("train_a.memory_peaks")
    c.eq("memory forward", find_row(rows, phase="forward")["peak (MiB)"], "2.5")
    c.true("bench_medium has no memory table", not os.path.exists(os.path.join(out, "bench_medium.memory_peaks.md")))

    # bench-attention: OOM marked, times per case.
    _, rows = md("attention.bench_attention")
    c.eq("attention rows", len(rows), 12)
    c.run("attention OOM", lambda: c.eq("naive 1024/128 OOM",
                                        [find_row(rows, impl="naive", seq="1024", head_dim="128")[k]
                                         for k in ("time (ms)", "status")], ["OOM", "OOM"]))
    c.run("attention flash", lambda: c.eq("flash 1024/128 time",
                                          find_row(rows, impl="flash", seq="1024", head_dim="128")["time (ms)"],
                                          "20.480"))
    c.run("attention naive", lambda: c.eq("naive 512/64 time",
                                          find_row(rows, impl="naive", seq="512", head_dim="64")["time (ms)"], "10.240"))

    # bench-collectives: units from the table's attribute, busbw per row.
    head, rows = md("collectives.bench_collectives")
    c.true("collectives busbw header has units", "busbw (GB/s)" in head)
    c.run("collectives row", lambda: c.eq("nccl 4 ranks 1 MiB busbw",
                                          find_row(rows, backend="nccl", ranks="4", **{"size (B)": "1048576"})["busbw (GB/s)"],
                                          "123.456"))

    # bench-gemm: a row per GEMM, the block totals with their aggregate rate.
    head, rows = md("gemm.bench_gemm")
    c.eq("gemm rows", len(rows), 2)
    c.run("gemm casts row", lambda: c.eq("qkv forward with casts", [find_row(rows, variant="gemm+casts")[k] for k in
                                                                  ("M", "time (ms)", "rate (TFLOP/s)")],
                                         ["8192", "1.2500", "1007"]))
    c.run("gemm accumulation", lambda: c.eq("qkv forward accumulation (precision.fp8_fast_accum)",
                                            find_row(rows, variant="gemm")["accumulation"], "fast"))
    _, rows = md("gemm.bench_gemm_totals")
    c.run("gemm totals", lambda: c.eq("fp8 gemm block rate", find_row(rows, variant="gemm")["block rate (TFLOP/s)"],
                                      "1333"))

    # Schema 1 read like schema 2: steps from 1 (the file's from 0), tokens/s, str cells.
    sys.path.insert(0, REPO)
    from analysis import h5load
    old = h5load.load(h5["train_a"])
    c.eq("schema 1 file", old.attrs["schema"], "lmscale-results/1")
    c.eq("schema 1 steps counted from 1", list(old.tables["/train/steps"]["step"])[:3], [1, 2, 3])
    c.eq("schema 1 eval steps kept", list(old.tables["/train/eval"]["step"]), [4, 9])
    c.eq("schema 1 tokens_per_s unit", old.unit("/train/steps", "tokens_per_s"), "tokens/s")
    c.eq("schema 1 string cells are str", {type(v) for v in old.tables["/system/ranks"]["host"]}, {str})
    c.eq("schema 1 has no attribute units", old.attr_unit("/train", "wall_s"), "")

    # system, unknown job, index
    _, rows = md("train_a.system")
    c.eq("ranks", [r["host"] for r in rows], ["node0", "node1"])
    with open(os.path.join(out, "index.md"), encoding="utf-8") as f:
        index = f.read()
    c.true("index has one note for the skipped files",
           index.count("not results files") == 1 and all(os.path.basename(o) in index for o in others))
    c.true("skipped files are not in the files table", "weights.h5 |" not in index)
    _, rows = md("accounting.accounting_summary")
    c.eq("accounting parameters", find_row(rows, quantity="parameters")["value"], "7")
    c.eq("accounting peak per rank", find_row(rows, quantity="peak per rank (MiB)")["value"], "3.0")
    _, rows = md("accounting.accounting_memory")
    c.eq("accounting memory components", [(r["component"], r["bytes (MiB)"]) for r in rows],
         [("parameters", "2.0"), ("gradients", "1.0")])
    head, rows = md("accounting.accounting_cost")
    c.eq("accounting cost total", find_row(rows, item="total")["cost"], "24")
    c.true("index has the combined bench table", "bench-model runs compared" in index)

    # LaTeX and PNG
    with open(os.path.join(out, "combined-bench-model.bench_model.tex"), encoding="utf-8") as f:
        tex = f.read()
    c.true("tex tabular", "\\begin{tabular}" in tex and "model.size" in tex and "12.346 $\\pm$ 0.500" in tex)
    pngs = ["train_a.train_loss", "train_a.train_step_time", "combined-train.train", "bench_small.bench_model_phases",
            "combined-bench-model.bench_model", "bench_small.memory_timeline", "attention.bench_attention_latency",
            "collectives.bench_collectives_busbw"]
    for name in pngs:
        c.run(f"png {name}", check_png, os.path.join(out, name + ".png"))

    # A study against one key: tokens/s and peak memory per run.
    out3 = os.path.join(work, "report-vs")
    proc = subprocess.run([sys.executable, "-m", "analysis.report", h5["bench_small"], h5["bench_medium"], "--out", out3,
                           "--vs", "model.size"], cwd=work, env=env, capture_output=True, text=True)
    c.eq("--vs exit status", proc.returncode, 0)
    head, rows = read_table(os.path.join(out3, "vs-model.size.bench_model.md"))
    c.eq("--vs columns", head, ["model.size", "tokens/s", "peak memory (GiB)"])
    c.eq("--vs rows", [(r["model.size"], r["tokens/s"], r["peak memory (GiB)"]) for r in rows],
         [("medium", "51200", "3.00"), ("small", "51200", "3.00")])
    c.run("png vs", check_png, os.path.join(out3, "vs-model.size.bench_model.png"))
    proc = subprocess.run([sys.executable, "-m", "analysis.report", h5["bench_small"], "--out", out3, "--vs", "no.key"],
                          cwd=work, env=env, capture_output=True, text=True)
    c.eq("--vs unknown key exit status", proc.returncode, 2)

    # The script runs directly too, and --format limits what is written.
    out2 = os.path.join(work, "report-md")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "analysis", "report.py"), h5["train_a"], "--out", out2,
                           "--format", "md"], cwd=work, env=dict(os.environ, MPLBACKEND="Agg"), capture_output=True,
                          text=True)
    c.eq("direct script exit status", proc.returncode, 0)
    written = sorted(os.listdir(out2)) if os.path.isdir(out2) else []
    c.true(f"--format md writes only .md ({written})", written and all(n.endswith(".md") for n in written))
    proc = subprocess.run([sys.executable, "-m", "analysis.report", os.path.join(work, "missing.h5"), "--out", out2],
                          cwd=work, env=env, capture_output=True, text=True)
    c.eq("missing file exit status", proc.returncode, 2)
    c.exit()


if __name__ == "__main__":
    main()
