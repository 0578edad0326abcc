#!/usr/bin/env python3
"""torch SDPA timed the way test_attention_cuda's DISABLED_Timing times lmscale's flash: CUDA
events around each call, median of N after warm-up, same [B,H,T,D] bf16 shape and causal mask.
(torch_peer.py attention uses a host timer with a synchronize per call, which adds ~10-30 us of
launch and sync latency: visible at small shapes such as 4 x 32 x 512 x 80.)
Usage: attention_sdpa_time.py --batch 4 --heads 32 --seq 512 --head-dim 80 [--causal] [--iters 30]
         [--backend default|flash|cudnn|efficient] [--kernels]
--backend pins SDPA to one implementation (torch.nn.attention.sdpa_kernel); default lets torch
choose, as torch_peer.py does. --kernels prints the CUDA kernels one forward + backward launches
(torch.profiler), which says what the default chose.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--backend", default="default", choices=["default", "flash", "cudnn", "efficient"])
    ap.add_argument("--kernels", action="store_true")
    a = ap.parse_args()
    if a.backend != "default":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        pick = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}[a.backend]
        sdpa_kernel(pick).__enter__()   # for the rest of the process
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
    f_ms = timed(fwd, a.warmup, a.iters)
    fb_ms = timed(lambda: fwd().backward(do), a.warmup, a.iters)
    o = fwd()
    b_ms = timed(lambda: o.backward(do, retain_graph=True), a.warmup, a.iters)
    if a.kernels:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fwd().backward(do)
            torch.cuda.synchronize()
        names = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
        print("kernels:", " | ".join(n[:90] for n in names))
    flop = 4.0 * a.batch * a.heads * a.seq * a.seq * a.head_dim / (2 if a.causal else 1)
    print(json.dumps(dict(impl="sdpa-events", backend=a.backend, batch=a.batch, heads=a.heads, seq=a.seq, head_dim=a.head_dim,
                          causal=a.causal, forward_ms=round(f_ms, 4), backward_ms=round(b_ms, 4),
                          forward_backward_ms=round(fb_ms, 4), fwd_tflops=round(flop / f_ms * 1e-9, 1),
                          fwd_bwd_tflops=round(3.5 * flop / fb_ms * 1e-9, 1))))


if __name__ == "__main__":
    main()
