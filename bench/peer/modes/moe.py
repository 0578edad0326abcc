"""mode `moe`: a mixture-of-experts LM (top-k routing, SwiGLU experts, dropless), one GPU or expert
parallel over all ranks of a torchrun launch.

Each block: h = x + Attn(RMSNorm(x)) as the dense model's, then y = h + sum over the k chosen
experts of gate x SwiGLU_e(RMSNorm(h)), gates renormalised over the top k, plus a Switch
load-balancing loss (E x sum_e fraction_e x mean probability_e, weight 0.01).
Experts run either as a Python loop of per-expert GEMMs (eager) or, with --grouped, as one
torch._grouped_mm per projection over all local experts, each expert's rows padded to 16
(torchtitan's formulation; bf16). Expert parallel (ranks > 1): rank r holds experts
[r E/ep, (r+1) E/ep); token rows travel to their experts' ranks and back by all_to_all_single;
dense weights are replicated and their gradients averaged; every rank runs its own --batch.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import runtime as rt
from ..model import Attention, RMSNorm, Shape, lm_loss, rope_tables


class _AllToAll(torch.autograd.Function):
    """Rows of x split by `send` to the ranks, `recv` rows arriving; the backward sends them back."""

    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.splits = (send, recv, group)
        out = x.new_empty((sum(recv), x.shape[1]))
        torch.distributed.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send, recv, group = ctx.splits
        out = grad.new_empty((sum(send), grad.shape[1]))
        torch.distributed.all_to_all_single(out, grad.contiguous(), send, recv, group=group)
        return out, None, None, None


class Experts(nn.Module):
    def __init__(self, count, d, f, grouped):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(count, d, f) * d ** -0.5)
        self.w3 = nn.Parameter(torch.randn(count, d, f) * d ** -0.5)
        self.w2 = nn.Parameter(torch.randn(count, f, d) * f ** -0.5)
        self.grouped = grouped

    def forward(self, x, counts):
        """x: rows sorted by local expert; counts: rows per local expert (a host list)."""
        return self._grouped(x, counts) if self.grouped else self._loop(x, counts)

    def _loop(self, x, counts):
        outs, start = [], 0
        for e, n in enumerate(counts):
            xe = x[start:start + n]
            start += n
            w1, w3, w2 = (w[e].to(x.dtype) for w in (self.w1, self.w3, self.w2))
            outs.append((F.silu(xe @ w1) * (xe @ w3)) @ w2)
        return torch.cat(outs)

    def _grouped(self, x, counts, align=16):
        padded = [max(align, (n + align - 1) // align * align) for n in counts]
        starts = torch.tensor([0] + padded[:-1]).cumsum(0).tolist()
        rows = [torch.arange(s, s + n, device=x.device) for s, n in zip(starts, counts) if n]
        idx = torch.cat(rows) if rows else torch.empty(0, dtype=torch.long, device=x.device)
        xp = x.new_zeros((sum(padded), x.shape[1])).index_copy(0, idx, x).to(torch.bfloat16)
        offs = torch.tensor(padded, device=x.device).cumsum(0).to(torch.int32)
        w1, w3, w2 = (w.to(torch.bfloat16) for w in (self.w1, self.w3, self.w2))
        h = F.silu(torch._grouped_mm(xp, w1, offs=offs)) * torch._grouped_mm(xp, w3, offs=offs)
        return torch._grouped_mm(h, w2, offs=offs).index_select(0, idx).to(x.dtype)


class MoEBlock(nn.Module):
    def __init__(self, shape, kind, experts, top_k, expert_dff, group, ep, grouped):
        super().__init__()
        self.attn, self.ln1, self.ln2 = Attention(shape, kind), RMSNorm(shape.d_model, 1e-5), RMSNorm(shape.d_model, 1e-5)
        self.router = nn.Linear(shape.d_model, experts, bias=False)
        self.E, self.k, self.group, self.ep, self.local = experts, top_k, group, ep, experts // ep
        self.experts = Experts(self.local, shape.d_model, expert_dff, grouped)
        self.aux = None

    def _dispatch(self, rows, counts):
        """Expert outputs for `rows` (sorted by global expert id, counts[e] rows for expert e)."""
        if self.ep == 1:
            return self.experts(rows, counts.tolist())
        dist, el = torch.distributed, self.local
        got = torch.empty_like(counts)
        dist.all_to_all_single(got, counts, group=self.group)  # got[s*el + e]: rows from rank s for local expert e
        got = got.view(self.ep, el)
        send, recv = counts.view(self.ep, el).sum(1).tolist(), got.sum(1).tolist()
        arrived = _AllToAll.apply(rows, send, recv, self.group)
        # arrived rows are blocks (source rank, local expert): order them by local expert
        expert_of = torch.repeat_interleave(torch.arange(el, device=rows.device).repeat(self.ep), got.reshape(-1))
        perm = torch.argsort(expert_of, stable=True)
        out = self.experts(arrived[perm], got.sum(0).tolist())
        back = torch.empty_like(out)
        back[perm] = out
        return _AllToAll.apply(back, recv, send, self.group)

    def forward(self, x, cos, sin):
        h = x + self.attn(self.ln1(x), cos, sin)
        B, T, d = h.shape
        y = self.ln2(h).reshape(-1, d)
        probs = torch.softmax(self.router(y).float(), dim=-1)
        gate, chosen = probs.topk(self.k, dim=-1)
        gate = (gate / gate.sum(-1, keepdim=True)).to(y.dtype)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.E)
        out = self._dispatch(y[order // self.k], counts)
        mixed = torch.empty_like(out)
        mixed[order] = out
        mixed = (mixed.view(-1, self.k, d) * gate.unsqueeze(-1)).sum(1)
        self.aux = self.E * (counts.float() / flat.numel() * probs.mean(0)).sum()
        return h + mixed.view(B, T, d)


def run(a):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    d = rt.Dist("nccl") if world > 1 else None
    dev = d.device if d else rt.pick_device(a.device)
    group = d.dist.group.WORLD if d else None
    if a.experts % world:
        raise SystemExit(f"{a.experts} experts do not split over {world} ranks")
    shape = Shape(a.d_model, 0, a.layers, a.heads, a.vocab, a.seq)
    torch.manual_seed(0)  # replicated dense weights; expert weights differ per rank below
    emb, head, ln_f = nn.Embedding(a.vocab, a.d_model), nn.Linear(a.d_model, a.vocab, bias=False), RMSNorm(a.d_model, 1e-5)
    blocks = nn.ModuleList(MoEBlock(shape, a.attention, a.experts, a.top_k, a.expert_dff, group, world, a.grouped)
                           for _ in range(a.layers))
    parts = nn.ModuleList([emb, head, ln_f, blocks]).to(dev)
    cos, sin = (t.to(dev) for t in rope_tables(a.seq, shape.head_dim, 10000.0))
    dense = [p for n, p in parts.named_parameters() if ".experts." not in n]
    opt = rt.make_adamw(parts.parameters(), lr=a.lr)
    x, y = rt.random_tokens(a.batch, a.seq, a.vocab, dev, seed=d.rank if d else 0)

    def step():
        from torch.utils.checkpoint import checkpoint
        opt.zero_grad(set_to_none=True)
        with rt.autocast(dev, a.precision):
            z = emb(x)
            for blk in blocks:
                z = checkpoint(blk, z, cos, sin, use_reentrant=False) if a.ac else blk(z, cos, sin)
            logits = head(ln_f(z))
        loss = lm_loss(logits, y) + 0.01 * sum(b.aux for b in blocks)
        loss.backward()
        if d:
            for p in dense:
                if p.grad is not None:
                    d.dist.all_reduce(p.grad, op=d.dist.ReduceOp.AVG)
        opt.step()

    rt.reset_peak(dev)
    step_ms, step_min = rt.time_runs(step, a.warmup, a.iters, dev)
    if d:
        step_ms, step_min = d.max_over_ranks(step_ms, step_min)
    if not d or d.rank == 0:
        active = a.layers * (4 * a.d_model ** 2 + 3 * a.top_k * a.d_model * a.expert_dff) + 2 * a.vocab * a.d_model
        rt.emit("moe", ranks=world, d_model=a.d_model, layers=a.layers, heads=a.heads, experts=a.experts,
                top_k=a.top_k, expert_dff=a.expert_dff, vocab=a.vocab, batch_per_rank=a.batch, seq=a.seq,
                precision=a.precision, attention=a.attention, ac=a.ac, grouped=a.grouped, step_ms=step_ms,
                step_ms_min=step_min, tokens_per_s=world * a.batch * a.seq / step_ms * 1e3,
                tflops_per_gpu=6 * active * a.batch * a.seq / step_ms / 1e9, peak_gib=rt.peak_gib(dev))
    if d:
        d.close()
