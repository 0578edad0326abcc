#!/usr/bin/env python3
"""trace_check.py RUN_TRACE RANKS STEPS STEP_RANGE [PHASE ...] [--collectives] [--self-test]

Checks the per-rank Chrome traces written by lmscale for run.trace = RUN_TRACE (docs/profiling.md):
RUN_TRACE = NAME.json (or NAME.json.gz) gives one file per rank, NAME.rank{r}.json (.json.gz, gzip).
- HTA (Holistic Trace Analysis, hta/common/trace_file.py and trace_parser.py) requirements: each
  file ends in .json or .gz and is read as HTA reads it (gzip for .gz); it is a JSON object with a
  traceEvents list and "distributedInfo" holding an integer "rank" >= 0, unique per file (here: r),
  with "world_size" = RANKS and a "backend"; every complete (X) event has "cat" and "dur" (HTA
  drops events without them); STEPS spans named ProfilerStep#N (cat user_annotation, N = 1..STEPS)
  on the host track, which HTA splits iterations by, each step's STEP_RANGE inside one of them;
- every event has ph, ts, pid, tid; X events have dur >= 0; pid = the file's rank, named by a
  process_name metadata event; no empty track: every track named by thread_name holds events;
- the host track (tid 0): X events nest (no partial overlap), STEP_RANGE is present, and every
  PHASE range is present and lies inside a STEP_RANGE (A|B: each of A and B present, a phase
  inside either);
- --collectives: each rank has X events on the comm track (tid 1) with args.bytes > 0, and
  matching async begin/end pairs (ph b/e with the same id);
- memory counters (ph C) carry bytes and max_bytes and are sampled: at most one per millisecond.
Exits 1 with the first violation. `--self-test` runs the checks on broken traces and fails unless
each one is caught.
"""
import gzip
import json
import re
import sys

HOST, COMM = 0, 1
EPS = 0.002  # us: timestamps are written with 3 decimals


class Bad(Exception):
    pass


def rank_path(run_trace, r):
    for tail in (".json.gz", ".json"):
        if run_trace.endswith(tail):
            return f"{run_trace[:-len(tail)]}.rank{r}{tail}"
    return f"{run_trace}.rank{r}.json"


def read_as_hta(path):
    """As hta/common/trace_file.py reads a trace file."""
    if not (path.endswith(".gz") or path.endswith(".json")):
        raise Bad(f"{path}: HTA reads only .json and .gz files")
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "r")) as f:
        return json.loads(f.read())


def check_hta(docs, ranks, steps, step):
    seen = set()
    for r, doc in enumerate(docs):
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            raise Bad(f"rank {r}: not a JSON object with a traceEvents list")
        info = doc.get("distributedInfo")
        if not isinstance(info, dict) or "rank" not in info:
            raise Bad(f"rank {r}: no distributedInfo.rank (HTA: 'Trace cannot be processed')")
        if not isinstance(info["rank"], int) or info["rank"] < 0 or info["rank"] in seen or info["rank"] != r:
            raise Bad(f"rank {r}: distributedInfo.rank = {info['rank']!r}")
        seen.add(info["rank"])
        if info.get("world_size") != ranks or not isinstance(info.get("backend"), str):
            raise Bad(f"rank {r}: distributedInfo {info} lacks world_size {ranks} or backend")
        events = doc["traceEvents"]
        for e in events:
            if e.get("ph") == "X" and ("cat" not in e or "dur" not in e):
                raise Bad(f"rank {r}: X event without cat or dur (HTA drops it): {e}")
        marks = [e for e in events if e.get("ph") == "X" and re.match(r"ProfilerStep\s*#\s*(\d+)", e["name"])]
        numbers = sorted(int(re.match(r"ProfilerStep\s*#\s*(\d+)", e["name"]).group(1)) for e in marks)
        if numbers != list(range(1, steps + 1)):
            raise Bad(f"rank {r}: ProfilerStep numbers {numbers}, expected 1..{steps}")
        if any(e.get("cat") != "user_annotation" or e["tid"] != HOST for e in marks):
            raise Bad(f"rank {r}: a ProfilerStep is not a user_annotation on the host track")
        for name in step.split("|"):
            for e in events:
                if e.get("ph") == "X" and e["name"] == name and not any(
                        m["ts"] - EPS <= e["ts"] and e["ts"] + e["dur"] <= m["ts"] + m["dur"] + EPS for m in marks):
                    raise Bad(f"rank {r}: '{name}' at {e['ts']} is not inside a ProfilerStep")


def check(doc, ranks, step, phases, collectives):
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise Bad("not a JSON object with a traceEvents list")
    events = doc["traceEvents"]
    declared = {(e["pid"], e["tid"]) for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in events if e.get("ph") != "M"}
    if declared - used:
        raise Bad(f"empty tracks declared (pid, tid): {sorted(declared - used)}")
    for e in events:
        for key in ("ph", "ts", "pid", "tid"):
            if key not in e:
                raise Bad(f"event without {key}: {e}")
        if e["ph"] == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            raise Bad(f"X event without dur >= 0: {e}")
    named = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    for r in range(ranks):
        if r not in named:
            raise Bad(f"rank {r} has no process_name")
        host = sorted((e for e in events if e["pid"] == r and e["tid"] == HOST and e["ph"] == "X"),
                      key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in host:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + EPS:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + EPS:
                raise Bad(f"rank {r}: '{e['name']}' overlaps '{stack[-1]['name']}' without nesting")
            stack.append(e)
        steps = []
        for name in step.split("|"):
            found = [e for e in host if e["name"] == name]
            if not found:
                raise Bad(f"rank {r}: no '{name}' range on the host track")
            steps += found
        for name in phases:
            found = [e for e in host if e["name"] == name]
            if not found:
                raise Bad(f"rank {r}: no '{name}' range on the host track")
            for e in found:
                if not any(s["ts"] - EPS <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + EPS for s in steps):
                    raise Bad(f"rank {r}: '{name}' at {e['ts']} is not inside a '{step}'")
        if collectives:
            comm = [e for e in events if e["pid"] == r and e["tid"] == COMM and e["ph"] == "X"]
            if not comm:
                raise Bad(f"rank {r}: no collective on the comm track")
            for e in comm:
                if not e.get("args", {}).get("bytes", 0) > 0:
                    raise Bad(f"rank {r}: collective without bytes: {e}")
            begins = {e["id"] for e in events if e["pid"] == r and e["ph"] == "b"}
            ends = {e["id"] for e in events if e["pid"] == r and e["ph"] == "e"}
            if not begins or begins != ends:
                raise Bad(f"rank {r}: async collective spans unpaired ({len(begins)} begins, {len(ends)} ends)")
        counters = [e for e in events if e["pid"] == r and e["ph"] == "C"]
        if not counters or not all(isinstance(e.get("args", {}).get("bytes"), int)
                                   and isinstance(e["args"].get("max_bytes"), int) for e in counters):
            raise Bad(f"rank {r}: no memory counter events with bytes and max_bytes")
        if max(e["args"]["max_bytes"] for e in counters) <= 0:
            raise Bad(f"rank {r}: memory counters never above 0")
        # Sampled: at most one counter per millisecond of the rank's trace (one per allocation
        # before issue 38: 65% of the events).
        mine = [e for e in events if e["pid"] == r and e["ph"] != "M"]
        span_ms = (max(e["ts"] for e in mine) - min(e["ts"] for e in mine)) / 1000
        if len(counters) > 1 + span_ms:
            raise Bad(f"rank {r}: {len(counters)} memory counters in {span_ms:.1f} ms: not sampled")


def self_test(docs, ranks, steps, step, phases, collectives):
    """Each mutation of good traces must be caught: the checker can fail."""
    import copy
    def merged(ds):
        return {"traceEvents": [e for d in ds for e in d["traceEvents"]]}
    def run(ds):
        check_hta(ds, ranks, steps, step)
        check(merged(ds), ranks, step, phases, collectives)
    def mutated(f):
        ds = copy.deepcopy(docs)
        f(ds)
        return ds
    first_x = lambda ev: next(e for e in ev if e["ph"] == "X" and e["tid"] == HOST)
    ev0 = lambda ds: ds[0]["traceEvents"]
    cases = {
        "missing dur": lambda ds: first_x(ev0(ds)).pop("dur"),
        "negative dur": lambda ds: first_x(ev0(ds)).__setitem__("dur", -1),
        "missing cat": lambda ds: first_x(ev0(ds)).pop("cat"),
        "no distributedInfo": lambda ds: ds[0].pop("distributedInfo"),
        "rank not an int": lambda ds: ds[0]["distributedInfo"].__setitem__("rank", "0"),
        "a ProfilerStep removed": lambda ds: ev0(ds).remove(next(e for e in ev0(ds) if e["name"].startswith("ProfilerStep#"))),
        "an empty track declared": lambda ds: ev0(ds).append({"name": "thread_name", "ph": "M", "pid": 0, "tid": 3, "ts": 0,
                                                              "args": {"name": "cuda compute"}}),
        "rank 1 removed": lambda ds: [d["traceEvents"].__setitem__(slice(None), [e for e in d["traceEvents"] if e["pid"] != ranks - 1]) for d in ds],
        "phase moved out of its step": lambda ds: next(e for e in ev0(ds) if e["name"] == phases[0]).__setitem__("ts", -1e9),
        "no counters": lambda ds: [d["traceEvents"].__setitem__(slice(None), [e for e in d["traceEvents"] if e["ph"] != "C"]) for d in ds],
        "a counter per allocation": lambda ds: ev0(ds).extend([dict(next(e for e in ev0(ds) if e["ph"] == "C"))] * len(ev0(ds))),
    }
    if collectives:
        cases["collectives off the comm track"] = lambda ds: [e.__setitem__("tid", 7) for d in ds for e in d["traceEvents"] if e["tid"] == COMM]
    for what, f in cases.items():
        try:
            run(mutated(f))
        except Bad:
            continue
        raise Bad(f"self-test: a trace with '{what}' passed")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    collectives = "--collectives" in sys.argv
    run_trace, ranks, steps, step, phases = args[0], int(args[1]), int(args[2]), args[3], args[4:]
    try:
        paths = [rank_path(run_trace, r) for r in range(ranks)]
        docs = [read_as_hta(p) for p in paths]
        check_hta(docs, ranks, steps, step)
        merged = {"traceEvents": [e for d in docs for e in d["traceEvents"]]}
        check(merged, ranks, step, phases, collectives)
        if "--self-test" in sys.argv:
            self_test(docs, ranks, steps, step, phases, collectives)
    except (Bad, OSError, ValueError) as e:
        print(f"FAIL: {run_trace}: {e}")
        return 1
    n = sum(len(d["traceEvents"]) for d in docs)
    print(f"PASS: {' '.join(paths)}: {n} events, ranks {ranks}, {steps} ProfilerSteps, {step} with {' '.join(phases)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
