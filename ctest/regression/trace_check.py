#!/usr/bin/env python3
"""trace_check.py TRACE.json RANKS STEP_RANGE [PHASE ...] [--collectives]

Checks the structure of a Chrome trace written by lmscale (run.trace, docs/profiling.md):
- a JSON object with a traceEvents list; every event has ph, ts, pid, tid; X events have dur >= 0;
- every rank 0..RANKS-1 is a process, named by a process_name metadata event;
- the host track (tid 0) of each rank: X events nest (no partial overlap), STEP_RANGE is present,
  and every PHASE range is present and lies inside a STEP_RANGE (A|B: each of A and B present, a
  phase inside either);
- --collectives: each rank has X events on the comm track (tid 1) with args.bytes > 0, and
  matching async begin/end pairs (ph b/e with the same id);
- each rank has counter events (ph C) of the allocator's bytes in use.
Exits 1 with the first violation. `--self-test` runs the checks on broken traces and fails unless
each one is caught.
"""
import json
import sys

HOST, COMM = 0, 1
EPS = 0.002  # us: timestamps are written with 3 decimals


class Bad(Exception):
    pass


def check(doc, ranks, step, phases, collectives):
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise Bad("not a JSON object with a traceEvents list")
    events = doc["traceEvents"]
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
        if not counters or not all(isinstance(e.get("args", {}).get("bytes"), int) for e in counters):
            raise Bad(f"rank {r}: no memory counter events with bytes")
        if max(e["args"]["bytes"] for e in counters) <= 0:
            raise Bad(f"rank {r}: memory counters never above 0")


def self_test(doc, ranks, step, phases, collectives):
    """Each mutation of a good trace must be caught: the checker can fail."""
    import copy
    def mutated(f):
        d = copy.deepcopy(doc)
        f(d["traceEvents"])
        return d
    first_x = lambda ev: next(e for e in ev if e["ph"] == "X" and e["tid"] == HOST)
    cases = {
        "missing dur": lambda ev: first_x(ev).pop("dur"),
        "negative dur": lambda ev: first_x(ev).__setitem__("dur", -1),
        "rank 1 removed": lambda ev: ev.__setitem__(slice(None), [e for e in ev if e["pid"] != ranks - 1]),
        "phase moved out of its step": lambda ev: next(e for e in ev if e["name"] == phases[0]).__setitem__("ts", -1e9),
        "no counters": lambda ev: ev.__setitem__(slice(None), [e for e in ev if e["ph"] != "C"]),
    }
    if collectives:
        cases["collectives off the comm track"] = lambda ev: [e.__setitem__("tid", 7) for e in ev if e["tid"] == COMM]
    for what, f in cases.items():
        try:
            check(mutated(f), ranks, step, phases, collectives)
        except Bad:
            continue
        raise Bad(f"self-test: a trace with '{what}' passed")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    collectives = "--collectives" in sys.argv
    path, ranks, step, phases = args[0], int(args[1]), args[2], args[3:]
    with open(path) as f:
        doc = json.load(f)
    try:
        check(doc, ranks, step, phases, collectives)
        if "--self-test" in sys.argv:
            self_test(doc, ranks, step, phases, collectives)
    except Bad as e:
        print(f"FAIL: {path}: {e}")
        return 1
    n = len(doc["traceEvents"])
    print(f"PASS: {path}: {n} events, ranks {ranks}, {step} with {' '.join(phases)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
