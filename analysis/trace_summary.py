#!/usr/bin/env python3
"""Per-step summary of lmscale Chrome traces (run.trace, docs/profiling.md "Chrome traces").

    python3 -m analysis.trace_summary TRACE_OR_DIR [...] [--track NAME] [--skip N] [--last N]
                                      [--top N] [--json]

Each argument is one rank's trace file (NAME.rankR.json or .json.gz) or a directory: every
*.json / *.json.gz in it whose top level holds "traceEvents" is read, ordered by rank
(`distributedInfo.rank`). For each rank it prints, for one track (default: `cuda compute` when the
file has it, else `host`; `--track comm` etc. picks another):

- the steps used: the `ProfilerStep#N` spans of the host track in time order, less the first
  `--skip N` (warm-up) and, with `--last N`, only the last N of the rest;
- the step span: the median over the used steps of the host ProfilerStep span, and the track's
  busy time per step (the sum of the step's top-level slices on the track);
- per range name: calls per step (mean), inclusive ms per step and self ms per step (medians over
  the used steps; a step without the name counts 0), sorted by self time, the first `--top N`;
- the `wait <op>` slices of the track summed per step (median), total and per name.

Definitions (exact, the test analysis.trace_summary checks them):

- Nesting is per track: slices are sorted by start, longer first; a slice's parent is the
  innermost earlier slice of the same track that contains it [start, end] (to 0.002 us, the
  rounding of the file's 3-decimal timestamps). Two slices with the same start and duration: the
  one written later in the file is the parent (lmscale writes a range when it ends, so inner
  ranges come first). Slices that only partly overlap (`comm p2p` sends and receives in flight
  together) are not nested: each counts at full length.
- Self time = duration - the durations of the direct children on the same track.
- Inclusive time of a name in a step = the sum of the durations of its slices that have no
  ancestor of the same name (a range inside a range of its own name is not counted twice).

Step assignment (one rule for every track). Step k's window is [start of ProfilerStep#k, start of
ProfilerStep#k+1) on the host clock; the last step's is [start, end] of its span. A slice of any
track belongs to the step whose window holds the slice's *start*; slices outside every window
(setup before the first step, the end of the job) are left out. Why this is right for lmscale's
traces: GPU slices (`cuda compute`) are placed on the host clock (docs/profiling.md) and a range's
GPU slice cannot start before the host queued it inside the step; both the train loop and
bench-model synchronize the device before a step's ProfilerStep span closes, so every GPU slice of
step k starts (and ends) before step k+1 begins. The mpi communication thread (`comm`) likewise
finishes a step's collectives before the step's gradient_sync returns. A trace written by a
program that lets the GPU run into the next step would need a different rule.

Exit status: 0; 2 on bad arguments or a file that is not a trace (one message naming the file
and the fix, nothing else printed).
"""
import argparse
import gzip
import json
import os
import statistics
import sys

STEP_PREFIX = "ProfilerStep#"
WAIT_PREFIX = "wait "
EPS_US = 0.002          # two units of the file's last digit (timestamps are written to 1 ns)
NAME_WIDTH = 40


class TraceError(Exception):
    """A file or argument the summary cannot use; the message names it and the fix."""


# ----------------------------------------------------------------------------- reading

def load_trace(path):
    """The trace's dict ({"traceEvents": [...], ...}) of one rank's file, plain or gzip."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, EOFError) as e:
        raise TraceError(f"{path}: not a readable Chrome trace ({e}); give the files run.trace wrote "
                         "(NAME.rankR.json or NAME.rankR.json.gz)")
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path}: no top-level \"traceEvents\" list; give the files run.trace wrote")
    return data


def trace_files(args):
    """The trace files named by the arguments (directories expanded), as (path, data) by rank."""
    loaded = []
    for arg in args:
        if os.path.isdir(arg):
            found = []
            for name in sorted(os.listdir(arg)):
                if not (name.endswith(".json") or name.endswith(".json.gz")):
                    continue
                path = os.path.join(arg, name)
                try:
                    found.append((path, load_trace(path)))
                except TraceError:
                    continue   # another JSON file in the run's directory (metrics, a config)
            if not found:
                raise TraceError(f"{arg}: no trace files (*.json, *.json.gz with \"traceEvents\") in this "
                                 "directory; point at the directory run.trace wrote into")
            loaded.extend(found)
        elif os.path.exists(arg):
            loaded.append((arg, load_trace(arg)))
        else:
            raise TraceError(f"{arg}: no such file or directory")
    return sorted(loaded, key=lambda pd: (rank_of(pd[1]), pd[0]))


def rank_of(data):
    info = data.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    for e in data["traceEvents"]:
        if isinstance(e, dict) and isinstance(e.get("pid"), int):
            return e["pid"]
    return 0


def track_names(events):
    """tid -> track name from the thread_name metadata ("tid N" for a tid without one)."""
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e.get("tid")] = str(e.get("args", {}).get("name", f"tid {e.get('tid')}"))
    for e in events:
        if e.get("ph") == "X" and e.get("tid") not in names:
            names[e.get("tid")] = f"tid {e.get('tid')}"
    return names


# ----------------------------------------------------------------------------- nesting and steps

class Slice:
    __slots__ = ("name", "ts", "dur", "order", "parent", "children_us", "own_name_above")

    def __init__(self, name, ts, dur, order):
        self.name, self.ts, self.dur, self.order = name, ts, dur, order
        self.parent = None
        self.children_us = 0.0
        self.own_name_above = False   # an ancestor has the same name

    @property
    def end(self):
        return self.ts + self.dur


def nest(slices):
    """Sets parent, children_us and own_name_above of one track's slices (see the docstring)."""
    slices.sort(key=lambda s: (s.ts, -s.dur, -s.order))
    open_slices = []   # candidates for parent, outermost first
    for s in slices:
        while open_slices and open_slices[-1].end <= s.ts + EPS_US:
            open_slices.pop()
        for candidate in reversed(open_slices):   # innermost that contains s entirely
            if candidate.end + EPS_US >= s.end:
                s.parent = candidate
                candidate.children_us += s.dur
                break
        p = s.parent
        while p is not None and not s.own_name_above:
            s.own_name_above = p.name == s.name
            p = p.parent
        open_slices.append(s)


def step_spans(events, host_tid):
    """The ProfilerStep#N spans of the host track, in time order: [(N, ts, dur)]."""
    spans = []
    for e in events:
        if e.get("ph") == "X" and e.get("tid") == host_tid and str(e.get("name", "")).startswith(STEP_PREFIX):
            try:
                number = int(e["name"][len(STEP_PREFIX):])
            except ValueError:
                continue
            spans.append((number, float(e["ts"]), float(e["dur"])))
    return sorted(spans, key=lambda s: s[1])


def step_of(ts, windows):
    """Index into windows [(begin, end)] of the window holding ts (begin <= ts < end), or None."""
    lo, hi = 0, len(windows)
    while lo < hi:   # the last window whose begin <= ts
        mid = (lo + hi) // 2
        if windows[mid][0] <= ts:
            lo = mid + 1
        else:
            hi = mid
    i = lo - 1
    return i if i >= 0 and ts < windows[i][1] else None


def summarize(path, data, track=None, skip=0, last=None):
    """The summary of one rank's trace as a dict (the --json layout of one rank)."""
    events = [e for e in data["traceEvents"] if isinstance(e, dict)]
    names = track_names(events)
    tid_of = {name: tid for tid, name in names.items()}
    if "host" not in tid_of:
        raise TraceError(f"{path}: no 'host' track (thread_name metadata); give a trace run.trace wrote")
    if track is None:
        track = "cuda compute" if "cuda compute" in tid_of else "host"
    if track not in tid_of:
        raise TraceError(f"{path}: --track '{track}' is not in this trace; its tracks: "
                         + ", ".join(f"'{n}'" for n in sorted(tid_of)))
    host_tid, tid = tid_of["host"], tid_of[track]

    spans = step_spans(events, host_tid)
    if not spans:
        raise TraceError(f"{path}: no ProfilerStep#N spans on the host track; record a train or bench-model "
                         "job with run.trace")
    if skip < 0 or skip >= len(spans):
        raise TraceError(f"--skip {skip}: {path} has {len(spans)} steps; skip from 0 to {len(spans) - 1}")
    if last is not None and last < 1:
        raise TraceError(f"--last {last}: give 1 or more steps")
    windows = [(ts, spans[i + 1][1] if i + 1 < len(spans) else ts + dur + EPS_US)
               for i, (_, ts, dur) in enumerate(spans)]
    used = list(range(skip, len(spans)))
    if last is not None:
        used = used[-last:]

    slices = []
    for order, e in enumerate(events):
        if e.get("ph") != "X" or e.get("tid") != tid:
            continue
        name = str(e.get("name", ""))
        if track == "host" and name.startswith(STEP_PREFIX):
            continue   # the step spans themselves: the steps, not a range inside one
        slices.append(Slice(name, float(e.get("ts", 0.0)), float(e.get("dur", 0.0)), order))
    nest(slices)

    n_used = len(used)
    position = {step: k for k, step in enumerate(used)}
    per_name = {}      # name -> [calls, incl_us per used step, self_us per used step]
    busy = [0.0] * n_used
    wait_total = [0.0] * n_used
    for s in slices:
        k = position.get(step_of(s.ts, windows))
        if k is None:
            continue
        row = per_name.setdefault(s.name, [0, [0.0] * n_used, [0.0] * n_used])
        row[0] += 1
        if not s.own_name_above:
            row[1][k] += s.dur
        row[2][k] += s.dur - s.children_us
        if s.parent is None:
            busy[k] += s.dur
        if s.name.startswith(WAIT_PREFIX):
            wait_total[k] += s.dur

    def ms(values_us):
        return statistics.median(values_us) / 1000.0

    ranges = [{"name": name, "calls_per_step": calls / n_used, "inclusive_ms": ms(incl), "self_ms": ms(own)}
              for name, (calls, incl, own) in per_name.items()]
    ranges.sort(key=lambda r: (-r["self_ms"], r["name"]))
    waits = [r for r in ranges if r["name"].startswith(WAIT_PREFIX)]
    return {
        "file": path,
        "rank": rank_of(data),
        "track": track,
        "tracks": sorted(tid_of),
        "steps_total": len(spans),
        "steps_used": [spans[i][0] for i in used],
        "step_ms": ms([spans[i][2] for i in used]),
        "busy_ms": ms(busy),
        "wait_ms": ms(wait_total),
        "waits": [{"name": w["name"], "calls_per_step": w["calls_per_step"], "ms": w["inclusive_ms"]} for w in waits],
        "ranges": ranges,
    }


# ----------------------------------------------------------------------------- printing

def cut(name, width=NAME_WIDTH):
    return name if len(name) <= width else name[:width - 3] + "..."


def steps_text(r):
    used = r["steps_used"]
    first, last = used[0], used[-1]
    listed = f"{first}-{last}" if used == list(range(first, last + 1)) else ",".join(map(str, used))
    return f"{len(used)} of {r['steps_total']} (ProfilerStep#{listed})"


def print_rank(r, top, out):
    print(f"rank {r['rank']}  {r['file']}", file=out)
    print(f"  track '{r['track']}'  steps {steps_text(r)}", file=out)
    print(f"  per step (median): step span {r['step_ms']:.3f} ms   in top-level ranges {r['busy_ms']:.3f} ms"
          f"   waits {r['wait_ms']:.3f} ms", file=out)
    for w in r["waits"]:
        print(f"    {cut(w['name'], 44):<44} {w['calls_per_step']:8.2f} calls {w['ms']:12.3f} ms", file=out)
    print(f"  {'range':<{NAME_WIDTH}} {'calls/step':>10} {'incl ms':>12} {'self ms':>12} {'self %':>7}", file=out)
    for row in r["ranges"][:top]:
        share = 100.0 * row["self_ms"] / r["step_ms"] if r["step_ms"] > 0 else 0.0
        print(f"  {cut(row['name']):<{NAME_WIDTH}} {row['calls_per_step']:10.2f} {row['inclusive_ms']:12.3f}"
              f" {row['self_ms']:12.3f} {share:7.1f}", file=out)
    hidden = len(r["ranges"]) - top
    if hidden > 0:
        print(f"  ({hidden} more ranges; --top {len(r['ranges'])} lists them all)", file=out)


def print_ranks_overview(results, out):
    print(f"{'rank':>4}  {'track':<13} {'steps':>5} {'step ms':>12} {'ranges ms':>12} {'waits ms':>12}  "
          "top self range", file=out)
    for r in results:
        first = r["ranges"][0]["name"] if r["ranges"] else "-"
        print(f"{r['rank']:>4}  {cut(r['track'], 13):<13} {len(r['steps_used']):>5} {r['step_ms']:12.3f}"
              f" {r['busy_ms']:12.3f} {r['wait_ms']:12.3f}  {cut(first, 28)}", file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python3 -m analysis.trace_summary",
        description="Per-step time per range of lmscale Chrome traces (run.trace), one block per rank.")
    parser.add_argument("traces", nargs="+", help="rank trace files (.json, .json.gz) or directories of them")
    parser.add_argument("--track", help="track to summarize (default: 'cuda compute' if present, else 'host')")
    parser.add_argument("--skip", type=int, default=0, help="leave out the first N ProfilerStep spans (warm-up)")
    parser.add_argument("--last", type=int, help="keep only the last N of the remaining steps")
    parser.add_argument("--top", type=int, default=30, help="ranges listed per rank, by self time (default 30)")
    parser.add_argument("--json", action="store_true", help="write every number as JSON to stdout instead")
    a = parser.parse_args(argv)
    try:
        if a.top < 1:
            raise TraceError(f"--top {a.top}: give 1 or more")
        results = [summarize(path, data, a.track, a.skip, a.last) for path, data in trace_files(a.traces)]
    except TraceError as e:
        print(f"trace_summary: {e}", file=sys.stderr)
        return 2
    if a.json:
        json.dump({"skip": a.skip, "last": a.last, "ranks": results}, sys.stdout, indent=1)
        print()
        return 0
    if len(results) > 1:
        print_ranks_overview(results, sys.stdout)
        print()
    for i, r in enumerate(results):
        if i:
            print()
        print_rank(r, a.top, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
