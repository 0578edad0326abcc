"""mode `attention`: one attention call [B, H, T, D] like lmscale's bench-attention
(inputs/attention_leaderboard.ini): forward, backward alone and forward+backward, per implementation
(sdpa: F.scaled_dot_product_attention, FlashAttention on H100/H200 in bf16; naive: materialized
scores). One JSON object per (impl, pass); a case that runs out of memory reports time_ms "OOM".
"""
import torch

from .. import runtime as rt
from ..model import attend

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def run(a):
    dev = rt.pick_device(a.device)
    dt = DTYPES[a.dtype]
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, do = (torch.randn(shape, generator=g, dtype=dt).to(dev) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    for impl in a.impl.split(","):
        def fwd():
            with torch.no_grad():
                attend(q, k, v, impl, a.causal)

        def fwd_bwd():
            attend(q, k, v, impl, a.causal).backward(do)

        for pass_ in a.passes.split(","):
            try:
                if pass_ == "forward":
                    med, low = rt.time_runs(fwd, a.warmup, a.iters, dev)
                elif pass_ == "forward-backward":
                    med, low = rt.time_runs(fwd_bwd, a.warmup, a.iters, dev)
                elif pass_ == "backward":
                    out = attend(q, k, v, impl, a.causal)
                    med, low = rt.time_runs(lambda: out.backward(do, retain_graph=True), a.warmup, a.iters, dev)
                    del out
                else:
                    raise SystemExit(f"--passes: unknown pass '{pass_}' (forward, backward, forward-backward)")
                times = dict(time_ms=med, time_ms_min=low)
            except torch.OutOfMemoryError:
                times = dict(time_ms="OOM", time_ms_min="OOM")
            for t in (q, k, v):
                t.grad = None
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            rt.emit("attention", impl=impl, **{"pass": pass_}, dtype=a.dtype, causal=a.causal, batch=a.batch,
                    heads=a.heads, seq=a.seq, head_dim=a.head_dim, **times)
