"""analysis.trace_summary (argv: LMSCALE DECK OUTDIR).

(1) A synthetic GPU-style trace of 4 steps whose slices are known: step k's GPU ranges are the
same shapes scaled by f_k = 10, 1, 2, 3 ms (step 1 the warm-up), lagging the host. Self and
inclusive times, calls, the skip/last rules, the wait sums, the tie rule (a child with its
parent's exact span, written first), a range inside a range of its own name, slices outside the
steps, two rank files (one gzip, by directory), the 100-column text and the refusals (exit 2).
(2) lmscale's own trace of DECK (a tiny CPU train): the step count equals the deck's train.steps
and the top-level ranges fit in the step span.
"""
import configparser
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

from analysis import trace_summary

lmscale, deck, out = sys.argv[1:4]
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)

F = [10.0, 1.0, 2.0, 3.0]   # per-step scale (ms); step 1 is the warm-up
HOST, COMM, GPU = 0, 1, 3


def synthetic(rank):
    """One rank's events: host ProfilerStep spans, host train_step, and GPU ranges (in us)."""
    ev = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}}]
    for tid, name in ((HOST, "host"), (COMM, "comm"), (GPU, "cuda compute")):
        ev.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": name}})

    def x(name, tid, ts_ms, dur_ms):
        ev.append({"name": name, "ph": "X", "pid": rank, "tid": tid, "ts": round(ts_ms * 1000, 3),
                   "dur": round(dur_ms * 1000, 3), "cat": "cpu_op"})

    x("setup", GPU, 0.0, 500.0)           # before the first step: in no step
    x("setup", HOST, 0.0, 600.0)
    b = 1000.0
    for k, f in enumerate(F):
        # Written as lmscale does: a range when it ends (inner first), the step span last.
        x("train_step", HOST, b + 1, 60 * f)
        g = lambda off: b + off * f      # noqa: E731  GPU offsets lag the host
        x("ffn_block", GPU, g(14), 6 * f)
        x("layer", GPU, g(12), 10 * f)
        x("layer", GPU, g(26), 4 * f)    # inside the second layer: a range inside its own name
        x("layer", GPU, g(24), 10 * f)
        x("forward", GPU, g(10), 30 * f)
        x("wait all-reduce", GPU, g(50), 3 * f)
        x("softmax", GPU, g(60), 10 * f)          # same span as its parent, written first
        x("attention_block", GPU, g(60), 10 * f)
        x("backward", GPU, g(40), 40 * f)
        x("wait reduce-scatter", GPU, g(81), 1 * f)
        x("optimizer", GPU, g(80), 8 * f)
        x("train_step", GPU, g(10), 80 * f)
        x("all-reduce", COMM, g(45), 5 * f)
        ev.append({"name": f"ProfilerStep#{k + 1}", "ph": "X", "pid": rank, "tid": HOST, "ts": round(b * 1000, 3),
                   "dur": round(100 * f * 1000, 3), "cat": "user_annotation"})
        b += 100 * f + 5                   # a 5 ms gap between the host's steps
    x("teardown", GPU, b + 50, 10.0)       # after the last step: in no step
    return {"traceEvents": ev, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2}}


# Per-step self and inclusive time, in units of f, and calls per step.
SELF = {"train_step": 2, "forward": 10, "layer": 14, "ffn_block": 6, "backward": 27, "attention_block": 0,
        "softmax": 10, "wait all-reduce": 3, "optimizer": 7, "wait reduce-scatter": 1}
INCL = {"train_step": 80, "forward": 30, "layer": 20, "ffn_block": 6, "backward": 40, "attention_block": 10,
        "softmax": 10, "wait all-reduce": 3, "optimizer": 8, "wait reduce-scatter": 1}
CALLS = {name: 1 for name in SELF} | {"layer": 3}

synth = os.path.join(out, "synthetic")
os.makedirs(synth)
with open(os.path.join(synth, "trace.rank0.json"), "w") as fh:
    json.dump(synthetic(0), fh)
with gzip.open(os.path.join(synth, "trace.rank1.json.gz"), "wt") as fh:
    json.dump(synthetic(1), fh)
with open(os.path.join(synth, "metrics.json"), "w") as fh:   # not a trace: skipped in a directory
    json.dump({"step": 1}, fh)


def run(*args):
    """(exit status, stdout, stderr) of trace_summary.main(args)."""
    so, se = io.StringIO(), io.StringIO()
    with redirect_stdout(so), redirect_stderr(se):
        rc = trace_summary.main([str(a) for a in args])
    return rc, so.getvalue(), se.getvalue()


def summary(*args):
    rc, text, err = run(*args, "--json")
    assert rc == 0, err
    return json.loads(text)["ranks"]


def close(a, b):
    return abs(a - b) < 1e-6


def check_gpu(r, f, steps):
    assert r["track"] == "cuda compute", r["track"]
    assert r["steps_total"] == 4 and r["steps_used"] == steps, r["steps_used"]
    by_name = {row["name"]: row for row in r["ranges"]}
    assert set(by_name) == set(SELF), sorted(by_name)   # setup/teardown are outside the steps
    for name in SELF:
        row = by_name[name]
        assert close(row["self_ms"], SELF[name] * f), (name, row, SELF[name] * f)
        assert close(row["inclusive_ms"], INCL[name] * f), (name, row, INCL[name] * f)
        assert close(row["calls_per_step"], CALLS[name]), (name, row)
    assert [row["name"] for row in r["ranges"]][:2] == ["backward", "layer"], r["ranges"]   # by self time
    assert close(r["step_ms"], 100 * f) and close(r["busy_ms"], 80 * f), r
    assert close(r["wait_ms"], 4 * f), r["wait_ms"]
    assert {w["name"]: w["ms"] for w in r["waits"]} == {"wait all-reduce": 3 * f, "wait reduce-scatter": 1 * f}


r0, r1 = summary(synth, "--skip", "1")        # medians over f = 1, 2, 3
assert (r0["rank"], r1["rank"]) == (0, 1) and r1["file"].endswith(".gz")
check_gpu(r0, 2.0, [2, 3, 4])
check_gpu(r1, 2.0, [2, 3, 4])
(r,) = summary(os.path.join(synth, "trace.rank0.json"))   # no skip: f = 10, 1, 2, 3, median 2.5
check_gpu(r, 2.5, [1, 2, 3, 4])
(r,) = summary(os.path.join(synth, "trace.rank0.json"), "--skip", "1", "--last", "1")
check_gpu(r, 3.0, [4])
(r,) = summary(os.path.join(synth, "trace.rank0.json"), "--skip", "1", "--track", "host")
assert [row["name"] for row in r["ranges"]] == ["train_step"], r["ranges"]   # ProfilerStep is the step, not a range
assert close(r["ranges"][0]["self_ms"], 120) and close(r["busy_ms"], 120) and r["wait_ms"] == 0
(r,) = summary(os.path.join(synth, "trace.rank0.json"), "--skip", "1", "--track", "comm")
assert [(x["name"], x["calls_per_step"]) for x in r["ranges"]] == [("all-reduce", 1.0)] and close(r["busy_ms"], 10)

rc, text, err = run(synth, "--skip", "1", "--top", "3")
assert rc == 0, err
lines = text.splitlines()
assert all(len(line) <= 100 for line in lines), max(lines, key=len)
assert [line.split()[:2] for line in lines if line.startswith("rank ") and line[5].isdigit()] == \
    [["rank", "0"], ["rank", "1"]], text   # one block per rank, after the overview of the ranks
assert lines[0].split()[:2] == ["rank", "track"] and lines[1].split()[:2] == ["0", "cuda"], text
assert text.count("(7 more ranges") == 2, text
print(text)

for args, needle in (((synth, "--track", "comm p2p"), "--track"), ((synth, "--skip", "4"), "--skip 4"),
                     ((os.path.join(synth, "metrics.json"),), "traceEvents"), ((os.path.join(out, "none"),), "none")):
    rc, text, err = run(*args)
    assert rc == 2 and text == "" and needle in err, (args, rc, text, err)

# (2) lmscale's own trace of a tiny CPU train (gzip), single rank.
cfg = configparser.ConfigParser()
cfg.read(deck)
steps = cfg.getint("train", "steps")
real = os.path.join(out, "real")
os.makedirs(real)
subprocess.run([lmscale, deck, f"--run.trace={real}/trace.json.gz", f"--run.output={real}/out.h5"],
               check=True, stdout=subprocess.DEVNULL)
(r,) = summary(real, "--skip", "2")
assert r["track"] == "host" and "cuda compute" not in r["tracks"], r["tracks"]   # a CPU run
assert r["steps_total"] == steps and r["steps_used"] == list(range(3, steps + 1)), (r["steps_total"], r["steps_used"])
by_name = {row["name"]: row for row in r["ranges"]}
assert by_name["train_step"]["calls_per_step"] == 1 and by_name["forward"]["calls_per_step"] >= 1, by_name
assert 0 < by_name["train_step"]["inclusive_ms"] <= r["busy_ms"] <= r["step_ms"], r
assert all(row["self_ms"] >= 0 and row["self_ms"] <= row["inclusive_ms"] + 1e-9 for row in r["ranges"]), r["ranges"]
rc, text, err = run(real, "--skip", "2")
assert rc == 0 and "train_step" in text and f"steps {steps - 2} of {steps}" in text, (text, err)
print(text)
print("ok")
