#!/usr/bin/env python3
"""A float64 NumPy reference of lmscale's model (the CS336 Transformer LM), to check a weights file.

    python3 -m analysis.reference_lm WEIGHTS TOKENS --context T [--dtype uint16] [--rows N]

WEIGHTS is a weights file written by ``train.save`` or ``prune.output``: safetensors (name ending in
.safetensors, read with the ``safetensors`` package) or HDF5 (h5py); the parameter names are the
CS336 ones (docs/hdf5.md). TOKENS is a raw token file; row r is tokens[r*(T+1) : (r+1)*(T+1)] and
the mean next-token cross-entropy (nats) of the rows is printed as JSON: {"loss": ..., "rows": N}.

The model: token embedding; per block x + attn(RMSNorm1(x)), then x + SwiGLU(RMSNorm2(x)); final
RMSNorm; LM head. RMSNorm is x / sqrt(mean(x^2) + eps) * g; attention is causal softmax(q k^T /
sqrt(Dh)) v over heads of Dh = d_model / num_heads, with RoPE on q and k rotating each pair
(x[2i], x[2i+1]) of a head by t * theta^(-2i/Dh); SwiGLU is w2(silu(w1 x) * w3 x). Linear weights
are [out, in] (y = x W^T). num_heads, rope_theta and norm_eps come from the file's resolved
configuration (metadata or attribute ``config``) unless given.
"""
import argparse
import json
import sys

import numpy as np


def load_weights(path):
    """{name: float64 array} and the file's metadata/attributes as {key: str}."""
    if path.endswith(".safetensors"):
        from safetensors import safe_open
        with safe_open(path, framework="np") as f:
            meta = dict(f.metadata() or {})
            return {k: f.get_tensor(k).astype(np.float64) for k in f.keys()}, meta
    import h5py
    with h5py.File(path, "r") as f:
        meta = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in f.attrs.items()}
        return {k: f[k][()].astype(np.float64) for k in f if isinstance(f[k], h5py.Dataset)}, meta


def model_keys(meta):
    """num_heads, rope_theta, norm_eps from the resolved configuration text in `meta`."""
    import configparser
    parser = configparser.RawConfigParser(strict=False)
    parser.read_string(meta.get("config", ""))
    get = lambda key, default: parser.get("model", key) if parser.has_option("model", key) else default  # noqa: E731
    return int(get("num_heads", meta.get("num_heads", 0))), float(get("rope_theta", meta.get("rope_theta", 10000))), \
        float(get("norm_eps", 1e-5))


def rmsnorm(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rope(x, theta):
    """x [B, H, T, Dh]: pair (x[2i], x[2i+1]) at position t rotates by t * theta^(-2i/Dh)."""
    T, Dh = x.shape[-2], x.shape[-1]
    angle = np.arange(T, dtype=np.float64)[:, None] * theta ** (-np.arange(0, Dh, 2, dtype=np.float64) / Dh)[None, :]
    c, s = np.cos(angle), np.sin(angle)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def logits(w, inputs, num_heads, theta=10000.0, eps=1e-5):
    """inputs [B, T] int -> logits [B, T, vocab], float64."""
    x = w["token_embeddings.weight"][inputs]
    B, T, d = x.shape
    Dh = d // num_heads
    layers = sum(1 for k in w if k.endswith(".attn.q_proj.weight"))
    causal = np.tril(np.ones((T, T), dtype=bool))
    for i in range(layers):
        p = f"layers.{i}."
        h = rmsnorm(x, w[p + "ln1.weight"], eps)
        q, k, v = ((h @ w[p + f"attn.{n}_proj.weight"].T).reshape(B, T, num_heads, Dh).transpose(0, 2, 1, 3)
                   for n in ("q", "k", "v"))
        q, k = rope(q, theta), rope(k, theta)
        s = np.where(causal, q @ k.transpose(0, 1, 3, 2) / np.sqrt(Dh), -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        o = (s / s.sum(-1, keepdims=True)) @ v
        x = x + o.transpose(0, 2, 1, 3).reshape(B, T, d) @ w[p + "attn.output_proj.weight"].T
        h = rmsnorm(x, w[p + "ln2.weight"], eps)
        a = h @ w[p + "ffn.w1.weight"].T
        x = x + ((a / (1 + np.exp(-a))) * (h @ w[p + "ffn.w3.weight"].T)) @ w[p + "ffn.w2.weight"].T
    return rmsnorm(x, w["ln_final.weight"], eps) @ w["lm_head.weight"].T


def loss(w, rows, num_heads, theta=10000.0, eps=1e-5):
    """Mean next-token cross-entropy (nats) of token rows [B, T+1]."""
    z = logits(w, rows[:, :-1], num_heads, theta, eps)
    m = z.max(-1, keepdims=True)
    logsumexp = (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[..., 0]
    target = np.take_along_axis(z, rows[:, 1:, None], -1)[..., 0]
    return float((logsumexp - target).mean())


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m analysis.reference_lm", description=__doc__.split("\n\n")[0])
    p.add_argument("weights")
    p.add_argument("tokens")
    p.add_argument("--context", type=int, required=True, help="model.context_length (T)")
    p.add_argument("--dtype", default="uint16", choices=("uint16", "uint32", "int32"))
    p.add_argument("--rows", type=int, default=1)
    args = p.parse_args(argv)
    w, meta = load_weights(args.weights)
    heads, theta, eps = model_keys(meta)
    if heads <= 0:
        sys.exit("analysis.reference_lm: the file gives no model.num_heads")
    T = args.context
    tokens = np.fromfile(args.tokens, dtype=args.dtype).astype(np.int64)
    if tokens.size < args.rows * (T + 1):
        sys.exit(f"analysis.reference_lm: {args.tokens} holds {tokens.size} tokens, fewer than {args.rows} x {T + 1}")
    rows = tokens[: args.rows * (T + 1)].reshape(args.rows, T + 1)
    print(json.dumps({"loss": loss(w, rows, heads, theta, eps), "rows": args.rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
