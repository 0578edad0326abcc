"""Pipeline parallelism: /pipeline/stages (per rank: stage, forward/backward busy time, idle
time, measured and theoretical bubble fraction, peak memory) and /pipeline/events (per rank and
step: which microbatch ran forward or backward, from when to when), written by bench-model and
train when parallel.pp > 1.

Table: stages. Plot: the schedule as a timeline, one row per stage (of data-parallel replica 0),
forward boxes light, backward boxes dark and zb-h1's deferred weight-gradient (W) passes green, each labelled with its microbatch (interleaved:
chunk.microbatch); the gaps are the bubble. Combined: bubble measured vs theory per file.
"""
from analysis import compare
from analysis.output import figure
from analysis.tables import Table, header, mib, num

SECTION = "pipeline"
JOBS = {"bench-model", "train"}
STAGES, EVENTS = "/pipeline/stages", "/pipeline/events"


def present(r):
    return r.has_table(STAGES)


def report(r, out, prefix):
    a = r.group_attrs("/pipeline")
    t = Table(f"{r.name}: pipeline stages ({a.get('schedule', '?')}, {a.get('microbatches', '?')} microbatches, "
              f"layers {a.get('stage_layers', '?')})",
              ["rank", "stage", "dp rank", header("forward", "ms"), header("backward", "ms"), header("idle", "ms"),
               header("span", "ms"), "bubble", "theory", header("peak", "MiB")],
              numeric=[True] * 10)
    for _, s in r.tables[STAGES].iterrows():
        t.add(int(s["rank"]), int(s["stage"]), int(s["dp_rank"]), num(s["forward_busy_ms"], ".2f"),
              num(s["backward_busy_ms"], ".2f"), num(s["idle_ms"], ".2f"), num(s["span_ms"], ".2f"),
              num(s["bubble_fraction"], ".3f"), num(s["theory_bubble_fraction"], ".3f"), mib(s["peak_bytes"]))
    out.table(f"{prefix}.pipeline_stages", t)
    if r.has_table(EVENTS) and len(r.tables[EVENTS]):
        fig = timeline(r)
        out.figure(f"{prefix}.pipeline_timeline", fig)


def timeline(r, step=None):
    """The schedule of one step (default: the last recorded) of dp replica 0, one row per stage."""
    ev = r.tables[EVENTS]
    st = r.tables[STAGES]
    replica0 = set(st[st["dp_rank"] == 0]["rank"])
    ev = ev[ev["rank"].isin(replica0)]
    step = ev["step"].max() if step is None else step
    ev = ev[ev["step"] == step]
    stages = sorted(ev["stage"].unique())
    a = r.group_attrs("/pipeline")
    fig, (ax,) = figure(width=max(6.4, 0.35 * len(ev) / max(1, len(stages))), height=0.7 + 0.55 * len(stages))
    interleaved = "chunk" in ev and ev["chunk"].max() > 0
    for _, e in ev.iterrows():
        y = len(stages) - 1 - stages.index(e["stage"])   # stage 0 on top
        back = e["phase"] == "backward"
        color = {"backward": "#1f4e9c", "weight": "#3a9c4a"}.get(e["phase"], "#8fb8ed")
        w = e["end_ms"] - e["start_ms"]
        ax.barh(y, w, left=e["start_ms"], height=0.8, color=color, edgecolor="black", linewidth=0.4)
        # Interleaved: "chunk.micro" (chunk = the rank's model chunk); else the microbatch.
        text = f"{int(e['chunk'])}.{int(e['micro'])}" if interleaved else str(int(e["micro"]))
        ax.text(e["start_ms"] + w / 2, y, text, ha="center", va="center", fontsize=6 if interleaved else 7,
                color="white" if back else "black")
    ax.set_yticks(range(len(stages)))
    ax.set_yticklabels([f"stage {s}" for s in reversed(stages)])
    ax.set_xlabel("time since the step's pipeline start (ms, each stage's clock)")
    ax.set_title(f"{r.name}: {a.get('schedule', '')} schedule, step {int(step)} "
                 f"(light: forward, dark: backward, green: W; bubble {100 * float(a.get('measured_bubble_fraction', 0)):.1f}% "
                 f"measured, {100 * float(a.get('theory_bubble_fraction', 0)):.1f}% theory)", fontsize=9)
    return fig


def combine(results, keys, out, prefix):
    t = Table("pipeline bubble compared", keys + ["bubble measured", "bubble theory"],
              numeric=[False] * len(keys) + [True, True])
    for r in results:
        a = r.group_attrs("/pipeline")
        t.add(*compare.key_cells(r, keys), num(a.get("measured_bubble_fraction"), ".3f"),
              num(a.get("theory_bubble_fraction"), ".3f"))
    out.table(f"{prefix}.pipeline_bubble", t)
