"""mode `check`: the float64 loss of an lmscale weights file (train.save) on given tokens.

The file's datasets carry lmscale's parameter names, which are this model's state_dict keys
(docs/architecture.md §2); num_heads, rope_theta and the resolved deck (for norm_eps and
context_length) are root attributes. Tokens: a .npy integer array [rows, T+1], or a raw token
file (--tokens-dtype, lmscale's data.dtype) cut into rows of context_length + 1 tokens (a
trailing remainder is dropped). The loss is the mean cross-entropy of predicting tokens[:, 1:]
from tokens[:, :-1], as lmscale logs it; in float64 it must equal lmscale's to rounding
(ctest analysis.bench_peer compares them).
"""
import re

import numpy as np
import torch

from .. import runtime as rt
from ..model import Shape, TransformerLM, lm_loss


def _deck_value(deck, key, default):
    m = re.search(rf"^{key}\s*=\s*(\S+)", deck, re.M)
    return type(default)(m.group(1)) if m else default


def load_weights(path):
    import h5py
    with h5py.File(path, "r") as f:
        tensors = {}
        f.visititems(lambda name, obj: tensors.__setitem__(name.replace("/", "."), np.asarray(obj, dtype=np.float64))
                     if isinstance(obj, h5py.Dataset) and name.endswith("weight") else None)
        attrs = {k: f.attrs[k] for k in f.attrs}
    deck = attrs.get("config", "")
    deck = deck.decode() if isinstance(deck, bytes) else str(deck)
    return tensors, attrs, deck


def load_tokens(path, dtype, context, rows):
    if path.endswith(".npy"):
        tok = np.load(path)
    else:
        flat = np.fromfile(path, dtype={"uint16": np.uint16, "uint32": np.uint32, "int32": np.int32}[dtype])
        n = flat.size // (context + 1)
        if n == 0:
            raise SystemExit(f"{path}: {flat.size} tokens, fewer than context + 1 = {context + 1}")
        tok = flat[:n * (context + 1)].reshape(n, context + 1)
    tok = torch.as_tensor(tok.astype(np.int64))
    return tok[:rows] if rows else tok


def run(a):
    tensors, attrs, deck = load_weights(a.weights)
    V, d = tensors["token_embeddings.weight"].shape
    layers = 1 + max(int(n.split(".")[1]) for n in tensors if n.startswith("layers."))
    heads = a.heads or int(attrs.get("num_heads", 0))
    if not heads:
        raise SystemExit(f"{a.weights} has no num_heads attribute: pass --heads")
    context = a.context or _deck_value(deck, "context_length", 0)
    if not context:
        raise SystemExit("pass --context (the file's deck does not say context_length)")
    shape = Shape(d, tensors["layers.0.ffn.w1.weight"].shape[0], layers, heads, V, context,
                  float(attrs.get("rope_theta", 10000.0)), _deck_value(deck, "norm_eps", 1e-5))
    model = TransformerLM(shape).double()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=True)
    tok = load_tokens(a.tokens, a.tokens_dtype, context, a.rows)
    with torch.no_grad():
        logits = model(tok[:, :-1])
        loss = lm_loss(logits, tok[:, 1:])
    rt.emit("check", weights=a.weights, rows=tok.shape[0], seq=tok.shape[1] - 1, d_model=d, layers=layers,
            heads=heads, vocab=V, loss=loss.item(), logits_rms=logits.pow(2).mean().sqrt().item())
