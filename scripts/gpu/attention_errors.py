#!/usr/bin/env python3
"""Accuracy of lmscale's flash attention and torch SDPA against a float64 reference, on the same
bf16 inputs (the leaderboard criterion: our errors no worse than 1.5x SDPA's own).

Writes random q, k, v, dO ([B,H,T,D] bf16) to a folder, runs the DISABLED_FileIO tool of
test_attention_cuda on them, computes SDPA's outputs and a float64 reference (head by head, on
the GPU), and prints ||x - ref|| / ||ref|| for O, lse, dQ, dK, dV.
Usage: attention_errors.py EXE [--batch 1 --heads 16 --seq 16384 --head-dim 64 --causal]
"""
import argparse
import json
import math
import os
import subprocess
import tempfile

import numpy as np
import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    a = ap.parse_args()
    B, H, T, D = a.batch, a.heads, a.seq, a.head_dim
    torch.manual_seed(1)
    shape = (B, H, T, D)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    io = tempfile.mkdtemp(prefix="attn_io_")
    for name, t in (("q", q), ("k", k), ("v", v), ("do", do)):
        t.contiguous().view(torch.int16).cpu().numpy().tofile(os.path.join(io, name + ".bin"))
    with open(os.path.join(io, "shape.txt"), "w") as f:
        f.write(f"{B} {H} {T} {D} {int(a.causal)}\n")
    subprocess.run([a.exe, "--gtest_also_run_disabled_tests", "--gtest_filter=*DISABLED_FileIO*"],
                   env=dict(os.environ, ATTN_IO=io), check=True, stdout=subprocess.DEVNULL)

    def load(name, dtype=torch.bfloat16, shp=shape):
        raw = np.fromfile(os.path.join(io, name + ".bin"), dtype=np.int16 if dtype == torch.bfloat16 else np.float32)
        t = torch.from_numpy(raw)
        if dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        return t.reshape(shp).cuda()

    mine = dict(o=load("o"), lse=load("lse", torch.float32, (B, H, T)), dq=load("dq"), dk=load("dk"), dv=load("dv"))

    qs, ks, vs = (x.clone().requires_grad_(True) for x in (q, k, v))
    o_s = F.scaled_dot_product_attention(qs, ks, vs, is_causal=a.causal)
    o_s.backward(do)
    sdpa = dict(o=o_s.detach(), dq=qs.grad, dk=ks.grad, dv=vs.grad)

    scale = 1.0 / math.sqrt(D)
    num = {impl: {key: 0.0 for key in ("o", "lse", "dq", "dk", "dv")} for impl in ("mine", "sdpa")}
    den = {key: 0.0 for key in ("o", "lse", "dq", "dk", "dv")}
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device="cuda"), 1) if a.causal else None
    for b in range(B):
        for h in range(H):
            qd, kd, vd, dod = (x[b, h].double() for x in (q, k, v, do))
            s = (qd @ kd.T) * scale
            if mask is not None:
                s.masked_fill_(mask, float("-inf"))
            lse = torch.logsumexp(s, dim=-1)
            p = torch.exp(s - lse[:, None])
            del s
            o = p @ vd
            dv = p.T @ dod
            dp = dod @ vd.T
            ds = p * (dp - (dp * p).sum(-1, keepdim=True))
            del dp, p
            dq = ds @ kd * scale
            dk = ds.T @ qd * scale
            del ds
            ref = dict(o=o, lse=lse, dq=dq, dk=dk, dv=dv)
            for key, r in ref.items():
                den[key] += float((r * r).sum())
                num["mine"][key] += float(((mine[key][b, h].double() - r) ** 2).sum())
                if key in sdpa:
                    num["sdpa"][key] += float(((sdpa[key][b, h].double() - r) ** 2).sum())
    res = {impl: {key: math.sqrt(num[impl][key] / den[key]) for key in den} for impl in num}
    del res["sdpa"]["lse"]
    print(json.dumps(dict(shape=dict(batch=B, heads=H, seq=T, head_dim=D, causal=a.causal), rel_err=res)))
    print(f"{'tensor':>6} {'lmscale flash':>14} {'torch SDPA':>11} {'ratio':>6}")
    for key in ("o", "dq", "dk", "dv"):
        m, s = res["mine"][key], res["sdpa"][key]
        print(f"{key:>6} {m:14.3e} {s:11.3e} {m / s:6.2f}")
    print(f"{'lse':>6} {res['mine']['lse']:14.3e}")


if __name__ == "__main__":
    main()
