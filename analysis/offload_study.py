"""The optimizer-offload study (bench/study_offload.sh, docs/performance.md "CPU offload").

Reads the study's output folder (one sub-folder per case: lmscale_*.h5 results of bench-model,
peer_*.jsonl lines of bench/torch_peer.py), and for each case prints a Markdown table row (step
time, GPU peak, host peak: medians over the runs) and draws the three as bars per case in one
figure: what offloading the optimizer costs in step time and buys in GPU memory, and where the
state went (host memory).

    python3 -m analysis.offload_study outputs/bench/offload --png docs/figures/offload_study.png
"""
import argparse
import glob
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis import h5load  # noqa: E402

GIB = 2.0**30

# Case folders of bench/study_offload.sh, in the order the figure shows them, with their labels.
CASES = [
    ("fsdp_xl", "xl, lmscale fsdp"),
    ("fsdp_xl_offload", "xl, lmscale fsdp + offload"),
    ("fsdp_xl_offload_params", "xl, lmscale fsdp + offload optimizer+params"),
    ("fsdp_xl_peer_offload", "xl, torch FSDP2 + CPU offload"),
    ("leaderboard_8b", "8b, lmscale fsdp"),
    ("leaderboard_8b_offload", "8b, lmscale fsdp + offload"),
    ("leaderboard_8b_offload_params", "8b, lmscale fsdp + offload optimizer+params"),
    ("fsdp_8b_peer_offload", "8b, torch FSDP2 + CPU offload"),
]


def _median(values):
    values = [v for v in values if v is not None and v == v]
    return statistics.median(values) if values else None


def load_case(folder):
    """Step ms, GPU peak GiB and host peak GiB of one case folder (medians over its runs), or None."""
    steps, gpu, host = [], [], []
    for path in sorted(glob.glob(os.path.join(folder, "lmscale_*.h5"))):
        a = h5load.load(path).group_attrs("/bench_model")
        steps.append(float(a["total_ms_median"]))
        gpu.append(float(a["peak_bytes"]) / GIB)
        host.append(float(a["host_peak_resident_bytes"]) / GIB if "host_peak_resident_bytes" in a else None)
    for path in sorted(glob.glob(os.path.join(folder, "peer_*.jsonl"))):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                rec = json.loads(line)
                steps.append(rec.get("step_ms"))
                gpu.append(rec.get("peak_gib"))
                host.append(rec.get("host_peak_gib"))
    if not steps:
        return None
    return {"step_ms": _median(steps), "gpu_gib": _median(gpu), "host_gib": _median(host), "runs": len(steps)}


def load_study(root):
    rows = []
    for case, label in CASES:
        r = load_case(os.path.join(root, case))
        if r is not None:
            rows.append(dict(r, case=case, label=label))
    return rows


def _fmt(v, digits):
    return "-" if v is None else f"{v:.{digits}f}"


def markdown(rows):
    out = ["| case | step (ms) | GPU peak (GiB) | host peak (GiB) | runs |", "| --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        out.append(f"| {r['label']} | {_fmt(r['step_ms'], 1)} | {_fmt(r['gpu_gib'], 2)} | {_fmt(r['host_gib'], 2)} | {r['runs']} |")
    return "\n".join(out)


def plot(rows, png):
    fig, axes = plt.subplots(1, 3, figsize=(15, 0.6 * len(rows) + 2.0), sharey=True)
    labels = [r["label"] for r in rows]
    for ax, key, title in zip(axes, ["step_ms", "gpu_gib", "host_gib"],
                              ["step time (ms, log scale)", "GPU peak per rank (GiB)", "host peak per rank (GiB)"]):
        values = [r[key] if r[key] is not None else 0.0 for r in rows]
        colors = ["tab:gray" if "torch" in lab else "tab:orange" if "offload" in lab else "tab:blue" for lab in labels]
        ax.barh(range(len(rows)), values, color=colors)
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:.3g}" if v else " -", va="center", fontsize=8)
        ax.set_title(title)
        if key == "step_ms":
            ax.set_xscale("log")
    axes[0].set_yticks(range(len(rows)))
    axes[0].set_yticklabels(labels)
    axes[0].invert_yaxis()
    fig.suptitle("Optimizer offload to host memory: step time, GPU and host memory (2 GPUs, bf16)")
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="bench/study_offload.sh's output folder (OUT)")
    p.add_argument("--png", help="write the figure here")
    a = p.parse_args(argv)
    rows = load_study(a.folder)
    if not rows:
        print(f"offload_study: no case folders with results under {a.folder}", file=sys.stderr)
        return 2
    print(markdown(rows))
    if a.png:
        plot(rows, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
