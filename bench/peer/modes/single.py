"""mode `model`: the LM on one device, like `lmscale` bench-model (inputs/bench_model_xl_*.ini).

Times the forward alone (no grad) and the full train step (forward, loss, backward, AdamW); eager
or torch.compile (the whole model, or --compile-blocks: each block on its own), naive or SDPA
attention, fp32 or bf16 autocast. --device cpu runs a smoke test.
--step-only leaves the forward's timing out (forward_ms null).
--float8: torchao's float8 training (convert_to_float8_training, its default tensorwise dynamic
recipe) on the blocks' seven linear layers, the peer of lmscale's precision.mode = fp8 with
precision.fp8_scaling = current; the LM head stays bf16 as in lmscale.
"""
import sys

import torch

from .. import runtime as rt
from ..model import TransformerLM, lm_loss


def run(a, shape):
    dev = rt.pick_device(a.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # lmscale's precision.tf32 = false
    torch.manual_seed(0)
    model = TransformerLM(shape, a.attention, a.ac).to(dev)
    if a.float8:
        to_float8(model)
    opt = rt.make_adamw(model.parameters())
    if a.compile_blocks:
        # Regional compilation (torchtitan compiles its float8 models this way): every block is the
        # same code over its own parameters, so Dynamo compiles one graph and every block reuses it.
        for blk in model.layers:
            blk.compile()
    fn = torch.compile(model) if a.compile else model
    x, y = rt.random_tokens(a.batch, shape.context, shape.vocab, dev)

    def forward():
        with torch.no_grad(), rt.autocast(dev, a.precision):
            fn(x)

    def step():
        opt.zero_grad(set_to_none=True)
        with rt.autocast(dev, a.precision):
            loss = lm_loss(fn(x), y)
        loss.backward()
        opt.step()

    fwd_ms = None if a.step_only else rt.time_runs(forward, a.warmup, a.iters, dev)[0]
    rt.reset_peak(dev)
    step_ms, step_min = rt.time_runs(step, a.warmup, a.iters, dev)
    rt.emit("model", size=a.size, d_model=shape.d_model, layers=shape.layers, parameters=shape.parameters(),
            precision=a.precision, compile="blocks" if a.compile_blocks else a.compile, float8=a.float8,
            attention=a.attention, ac=a.ac, batch=a.batch, seq=shape.context, device=str(dev), forward_ms=fwd_ms,
            step_ms=step_ms, step_ms_min=step_min, tokens_per_s=a.batch * shape.context / step_ms * 1e3,
            peak_gib=rt.peak_gib(dev))


def to_float8(model):
    """Swaps the blocks' nn.Linear layers for torchao's Float8Linear (exit 2 without torchao)."""
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError as e:
        print(f"--float8 needs torchao (pip install torchao): {e}", file=sys.stderr)
        raise SystemExit(2)
    convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn.startswith("layers."))
