"""The lmscale Transformer LM in PyTorch (docs/architecture.md §2).

Token embedding -> pre-norm blocks (h = x + Attn(RMSNorm(x)); y = h + SwiGLU(RMSNorm(h)), RoPE on
q and k over adjacent pairs (2i, 2i+1), causal attention) -> final RMSNorm -> untied LM head, no
biases. Module names give `named_parameters()` exactly lmscale's parameter names
(`layers.{i}.attn.q_proj.weight`, `layers.{i}.ffn.w1.weight`, ...), so a weights file written by
`train.save` loads with `load_state_dict` and no renaming (modes/check.py).

Numerics follow lmscale's: RMSNorm statistics, softmax and the loss run in at least fp32 (float64
stays float64), RoPE angles are computed in float64 and stored in the activations' dtype.
"""
import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

# name: d_model, d_ff, layers, heads, vocab (lmscale's model.size presets, src/io/presets.cpp)
PRESETS = {
    "small": (768, 3072, 12, 12, 10000),
    "medium": (1024, 4096, 24, 16, 10000),
    "large": (1280, 5120, 36, 20, 10000),
    "xl": (1600, 6400, 48, 25, 10000),
    "2.7B": (2560, 10240, 32, 32, 10000),
    "8b": (4096, 11008, 34, 32, 151936),
}


@dataclass(frozen=True)
class Shape:
    d_model: int
    d_ff: int
    layers: int
    heads: int
    vocab: int
    context: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self):
        return self.d_model // self.heads

    def parameters(self):
        d, f, v = self.d_model, self.d_ff, self.vocab
        return self.layers * (4 * d * d + 3 * d * f + 2 * d) + 2 * v * d + d


def shape_from(size, context, **overrides):
    """A preset with any of d_model, d_ff, layers, heads, vocab replaced (None keeps the preset's)."""
    d, f, n, h, v = PRESETS[size]
    s = Shape(d, f, n, h, v, context)
    s = replace(s, **{k: val for k, val in overrides.items() if val is not None})
    if s.d_model % s.heads or s.head_dim % 2:
        raise SystemExit(f"d_model {s.d_model} must split into {s.heads} heads of an even dimension")
    return s


def at_least_fp32(x):
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        x32 = at_least_fp32(x)
        r = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return ((x32 * r) * self.weight.to(x32.dtype)).to(x.dtype)


def rope_tables(context, head_dim, theta):
    """cos and sin [context, head_dim/2] of angle t * theta^(-2i/head_dim), in float64."""
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(context, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):
    """x [B, H, T, Dh]: pair (x[2i], x[2i+1]) rotates by the angle of (t, i)."""
    T = x.shape[-2]
    c, s = cos[:T].to(x.dtype), sin[:T].to(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def naive_attention(q, k, v, causal=True):
    """softmax(q k^T / sqrt(Dh)) v with the softmax in at least fp32, like lmscale's naive kernel."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[-2]
        keep = torch.ones(T, T, device=q.device, dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(at_least_fp32(s), dim=-1).to(v.dtype) @ v


def attend(q, k, v, kind, causal=True):
    if kind == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return naive_attention(q, k, v, causal)


class Attention(nn.Module):
    def __init__(self, shape, kind):
        super().__init__()
        d = shape.d_model
        self.q_proj, self.k_proj, self.v_proj, self.output_proj = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.head_dim, self.kind = shape.head_dim, kind

    def forward(self, y, cos, sin):
        B, T, _ = y.shape
        # -1 heads: under tensor parallelism the projections hold only this rank's heads
        q, k, v = (p(y).view(B, T, -1, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        o = attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, self.kind)
        return self.output_proj(o.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(d, f, bias=False), nn.Linear(f, d, bias=False), nn.Linear(d, f, bias=False)

    def forward(self, y):
        return self.w2(F.silu(self.w1(y)) * self.w3(y))


class Block(nn.Module):
    def __init__(self, shape, kind):
        super().__init__()
        self.attn = Attention(shape, kind)
        self.ln1, self.ln2 = RMSNorm(shape.d_model, shape.norm_eps), RMSNorm(shape.d_model, shape.norm_eps)
        self.ffn = SwiGLU(shape.d_model, shape.d_ff)

    def forward(self, x, cos, sin):
        h = x + self.attn(self.ln1(x), cos, sin)
        return h + self.ffn(self.ln2(h))


class Blocks(nn.Module):
    """Blocks [first, first+count) with their RoPE tables; optionally each block recomputed in the
    backward (activation checkpointing: only block inputs are kept)."""

    def __init__(self, shape, kind, count, checkpoint=False):
        super().__init__()
        self.layers = nn.ModuleList(Block(shape, kind) for _ in range(count))
        cos, sin = rope_tables(shape.context, shape.head_dim, shape.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.checkpoint = checkpoint

    def run(self, x):
        from torch.utils.checkpoint import checkpoint
        for blk in self.layers:
            if self.checkpoint and torch.is_grad_enabled():
                x = checkpoint(blk, x, self.rope_cos, self.rope_sin, use_reentrant=False)
            else:
                x = blk(x, self.rope_cos, self.rope_sin)
        return x


class TransformerLM(Blocks):
    def __init__(self, shape, kind="naive", checkpoint=False):
        super().__init__(shape, kind, shape.layers, checkpoint)
        self.token_embeddings = nn.Embedding(shape.vocab, shape.d_model)
        self.ln_final = RMSNorm(shape.d_model, shape.norm_eps)
        self.lm_head = nn.Linear(shape.d_model, shape.vocab, bias=False)

    def forward(self, ids):
        return self.lm_head(self.ln_final(self.run(self.token_embeddings(ids))))


class PipelineStage(Blocks):
    """Layers [lo, hi) of the LM as one pipeline stage: the first stage also embeds, the last also
    holds the final norm and the LM head (lmscale's stage split, docs/architecture.md §4)."""

    def __init__(self, shape, kind, lo, hi, first, last, checkpoint=False):
        super().__init__(shape, kind, hi - lo, checkpoint)
        self.token_embeddings = nn.Embedding(shape.vocab, shape.d_model) if first else None
        self.ln_final = RMSNorm(shape.d_model, shape.norm_eps) if last else None
        self.lm_head = nn.Linear(shape.d_model, shape.vocab, bias=False) if last else None

    def forward(self, x):
        if self.token_embeddings is not None:
            x = self.token_embeddings(x)
        x = self.run(x)
        return self.lm_head(self.ln_final(x)) if self.lm_head is not None else x


def lm_loss(logits, targets):
    """Mean cross-entropy over all tokens, in at least fp32."""
    return F.cross_entropy(at_least_fp32(logits).reshape(-1, logits.shape[-1]), targets.reshape(-1))
