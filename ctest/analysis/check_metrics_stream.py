#!/usr/bin/env python3
"""check_metrics_stream.py LMSCALE DECK REPO OUTDIR: run.metrics (docs/metrics.md), end to end.

Runs a tiny train (2 ranks when mpirun is there, else 1) with run.metrics, eval and log_every set,
and checks the stream: every line one JSON object; the resolved deck first; one train_step per
logged step (the first, every log_every-th and the last, counted from 1) with every documented
field, finite loss, positive tokens/s and TFLOP/s per GPU, memory > 0, skipped a bool; one eval
per evaluation with the loss stdout printed; the progress lines carry the same steps in
torchtitan's order. Then the TensorBoard import of docs/metrics.md runs on the file (a stand-in
SummaryWriter records what it is given: TensorBoard need not be installed) and must log the loss of
every logged step. A second run to the same path replaces the stream; a deck whose run.metrics is
run.output, or an existing file that is not a stream, is exit 2 naming the key, nothing written.
"""
import json, os, re, shutil, subprocess, sys, types

lmscale, deck, repo, out = sys.argv[1:5]
os.makedirs(out, exist_ok=True)
os.chdir(out)
failures = []


def check(what, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + what + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(what)


steps, log_every, eval_every = 12, 5, 6
ranks = 2 if shutil.which("mpirun") else 1
cmd = [lmscale, deck, "--run.output=m.h5", "--run.metrics=m.jsonl", "--run.progress=true",
       f"--train.log_every={log_every}", f"--train.eval_every={eval_every}", "--train.eval_batches=1"]
if ranks > 1:
    cmd = ["mpirun", "-np", str(ranks), "--bind-to", "none"] + cmd
run = subprocess.run(cmd, capture_output=True, text=True)
check("train with run.metrics exits 0", run.returncode == 0, run.stderr[-800:])
lines = open("m.jsonl").read().splitlines() if os.path.exists("m.jsonl") else []
records = []
for i, line in enumerate(lines):
    try:
        records.append(json.loads(line))
    except ValueError as e:
        check(f"line {i + 1} is JSON", False, f"{e}: {line[:120]}")
check("the stream has lines", len(records) > 1, f"{len(records)} records")
if records:
    first = records[0]
    check("the deck comes first", first.get("kind") == "deck" and first.get("job") == "train", str(first)[:200])
    d = first.get("deck", {})
    check("the deck is the resolved one", d.get("run.metrics") == "m.jsonl" and d.get("train.steps") == str(steps)
          and d.get("parallel.dp") == str(ranks), str(list(d.items())[:5]))
    check("the deck line gives the world", first.get("world") == ranks, str(first.get("world")))
logged = sorted({1, steps} | {s for s in range(1, steps + 1) if s % log_every == 0})
train = [r for r in records if r.get("kind") == "train_step"]
check("one train_step per logged step, counted from 1", [r["step"] for r in train] == logged,
      f"{[r.get('step') for r in train]} != {logged}")
fields = ["step", "loss", "lr", "grad_norm", "step_ms", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
          "memory_bytes", "memory_fraction", "loss_scale", "skipped", "elapsed_s", "eta_s"]
for r in train:
    missing = [f for f in fields if f not in r]
    check(f"step {r['step']}: every documented field", not missing, str(missing))
    if missing:
        continue
    check(f"step {r['step']}: loss finite, rates and memory positive",
          isinstance(r["loss"], float) and r["loss"] > 0 and r["tokens_per_s_per_gpu"] > 0 and r["tflops_per_gpu"] > 0
          and r["memory_bytes"] > 0 and 0 < r["memory_fraction"] < 1 and r["lr"] >= 0, str(r))
    check(f"step {r['step']}: skipped is a bool, MFU null on CPUs",
          r["skipped"] is False and r["mfu"] is None, f"skipped {r['skipped']!r} mfu {r['mfu']!r}")
evals = [r for r in records if r.get("kind") == "eval"]
check("one eval per evaluation", [r["step"] for r in evals] == [6, 12], str([r.get("step") for r in evals]))
printed = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^eval  step +(\d+)  loss ([0-9.]+)$", run.stdout, re.M)}
for r in evals:
    check(f"eval {r['step']}: the loss printed", abs(printed.get(r["step"], -1) - r["loss"]) < 5e-5,
          f"{printed.get(r['step'])} vs {r['loss']}")
# Progress lines: torchtitan's fields in its order, the same steps as the stream.
line_re = re.compile(r"^step +(\d+)/%d  loss [0-9.]+  lr [0-9.e+-]+  grad_norm [0-9.]+  memory [0-9.]+ GiB \([0-9.]+%%\)  "
                     r"tok/s/gpu \d+  TFLOP/s (\S+)  MFU (\S+)  [0-9.]+ ms  ETA \S+$" % steps, re.M)
shown = [(int(m.group(1)), m.group(2), m.group(3)) for m in line_re.finditer(run.stdout)]
check("progress lines in torchtitan's order at the logged steps", [s for s, _, _ in shown] == logged,
      run.stdout[:600])
check("TFLOP/s is not printed as zero on a CPU", all(float(t) > 0 for _, t, _ in shown), str(shown))
check("MFU n/a on a CPU", all(m == "n/a" for _, _, m in shown), str(shown))

# The TensorBoard import of docs/metrics.md, with a stand-in SummaryWriter.
doc = open(os.path.join(repo, "docs", "metrics.md")).read()
block = re.search(r"### Into TensorBoard\n\n```python\n(.*?)```", doc, re.S)
check("docs/metrics.md has the TensorBoard import", block is not None)
if block:
    code = block.group(1)
    check("the import is about ten lines", len(code.strip().splitlines()) <= 12, str(len(code.splitlines())))
    logged_scalars, texts = [], []

    class SummaryWriter:
        def __init__(self, logdir):
            self.logdir = logdir

        def add_scalar(self, tag, value, step):
            logged_scalars.append((tag, value, step))

        def add_text(self, tag, text):
            texts.append((tag, text))

        def close(self):
            pass

    for name in ("torch", "torch.utils", "torch.utils.tensorboard"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["torch.utils.tensorboard"].SummaryWriter = SummaryWriter
    saved = sys.argv
    sys.argv = ["import_tb.py", "m.jsonl", "runs/test"]
    try:
        exec(compile(code, "docs/metrics.md", "exec"), {"__name__": "__main__"})
    finally:
        sys.argv = saved
    losses = {s: v for tag, v, s in logged_scalars if tag == "train_step/loss"}
    check("TensorBoard gets the loss of every logged step",
          sorted(losses) == logged and all(abs(losses[r["step"]] - r["loss"]) == 0 for r in train), str(losses))
    check("TensorBoard gets the eval loss", sorted(s for tag, _, s in logged_scalars if tag == "eval/loss") == [6, 12])
    check("TensorBoard gets the deck as text", texts and "run.job = train" in texts[0][1], str(texts)[:200])

# bench-model: a bench_step record per timed step, and progress lines as steps end (the first
# warm-up step and the last timed one at least; at most one a second in between).
bench = subprocess.run([lmscale, "--run.job=bench-model", "--parallel.device=cpu", "--model.vocab_size=97",
                        "--model.context_length=16", "--model.d_model=32", "--model.d_ff=88", "--model.num_heads=4",
                        "--model.num_layers=2", "--bench.warmup=2", "--bench.steps=4", "--bench.batch_size=4",
                        "--run.output=b.h5", "--run.metrics=b.jsonl"], capture_output=True, text=True)
check("bench-model with run.metrics exits 0", bench.returncode == 0, bench.stderr[-400:])
brecs = [json.loads(l) for l in open("b.jsonl")] if os.path.exists("b.jsonl") else []
bsteps = [r for r in brecs if r.get("kind") == "bench_step"]
check("bench-model: one bench_step per timed step", [r["step"] for r in bsteps] == [1, 2, 3, 4],
      str([r.get("step") for r in bsteps]))
check("bench-model: rates per GPU in every record",
      all(r["tflops_per_gpu"] > 0 and r["tokens_per_s_per_gpu"] > 0 and r["step_ms"] > 0 for r in bsteps))
step_line = r"  [0-9.]+ ms  loss [0-9.]+  memory [0-9.]+ GiB \([0-9.]+%\)  tok/s/gpu \d+  TFLOP/s [0-9.]+  MFU \S+$"
check("bench-model: a line for the first warm-up step",
      re.search(r"^warm-up step +1/2" + step_line, bench.stdout, re.M) is not None, bench.stdout[:400])
check("bench-model: a line for the last timed step",
      re.search(r"^timed step +4/4" + step_line, bench.stdout, re.M) is not None, bench.stdout[:400])

# A second run replaces its own stream; other files and aliases are refused (exit 2, nothing written).
again = subprocess.run([lmscale, deck, "--run.output=m2.h5", "--run.metrics=m.jsonl", "--train.steps=4",
                        "--optim.warmup_steps=1"],
                       capture_output=True, text=True)
check("a stream replaces an earlier stream", again.returncode == 0 and
      sum(1 for l in open("m.jsonl") if '"train_step"' in l) == 2, again.stderr[-400:])
open("notes.txt", "w").write("my notes\n")
for name, args in [("run.metrics = run.output", ["--run.output=same.h5", "--run.metrics=same.h5"]),
                   ("run.metrics = ./run.output", ["--run.output=same2.jsonl", "--run.metrics=./same2.jsonl"]),
                   ("run.metrics = run.trace", ["--run.output=t.h5", "--run.trace=t.json", "--run.metrics=t.json"]),
                   ("run.metrics = train.save", ["--run.output=s.h5", "--train.save=w.h5", "--run.metrics=w.h5"]),
                   ("run.metrics over a file that is not a stream", ["--run.output=n.h5", "--run.metrics=notes.txt"])]:
    bad = subprocess.run([lmscale, deck] + args, capture_output=True, text=True)
    written = [a.split("=", 1)[1] for a in args if a.split("=", 1)[1] not in ("notes.txt",)]
    check(f"{name}: exit 2 naming run.metrics, nothing written",
          bad.returncode == 2 and "run.metrics" in bad.stderr and not any(os.path.exists(w) for w in written)
          and open("notes.txt").read() == "my notes\n", f"exit {bad.returncode}: {bad.stderr.strip()[:300]}")

print("PASS" if not failures else f"FAIL ({len(failures)})")
sys.exit(1 if failures else 0)
