"""mode `tp`: Megatron tensor parallelism with DTensor over all ranks of a torchrun launch.

In every block q, k, v, w1 and w3 are column-parallel (each rank holds heads / tp heads and
d_ff / tp columns) and output_proj and w2 row-parallel (one all-reduce after attention and one
after the MLP, forward and backward). The embedding, the norms and the LM head stay replicated
(lmscale also splits the vocabulary; its tp_2.7B_tp2.ini and this peer both report whole steps).
Every rank runs the whole global --batch, as in lmscale's tp decks. No sequence parallelism.
"""
import torch

from .. import runtime as rt
from ..model import TransformerLM, lm_loss


def run(a, shape):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    d = rt.Dist("nccl")
    if shape.heads % d.world or shape.d_ff % d.world:
        raise SystemExit(f"{shape.heads} heads and d_ff {shape.d_ff} must split over {d.world} ranks")
    torch.manual_seed(0)  # the same replicated weights on every rank
    model = TransformerLM(shape, a.attention, a.ac).to(d.device)
    mesh = init_device_mesh("cuda", (d.world,))
    plan = {"attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(), "attn.v_proj": ColwiseParallel(),
            "attn.output_proj": RowwiseParallel(),
            "ffn.w1": ColwiseParallel(), "ffn.w3": ColwiseParallel(), "ffn.w2": RowwiseParallel()}
    for blk in model.layers:
        parallelize_module(blk, mesh, plan)
    # one optimizer per kind of tensor: a fused AdamW call takes DTensors or plain tensors, not both
    params = list(model.parameters())
    groups = [[p for p in params if isinstance(p, DTensor)], [p for p in params if not isinstance(p, DTensor)]]
    opts = [rt.make_adamw(g) for g in groups if g]
    x, y = rt.random_tokens(a.batch, shape.context, shape.vocab, d.device)

    def step():
        for o in opts:
            o.zero_grad(set_to_none=True)
        with rt.autocast(d.device, a.precision):
            loss = lm_loss(model(x), y)
        loss.backward()
        for o in opts:
            o.step()

    rt.reset_peak(d.device)
    step_ms, step_min = rt.time_runs(step, a.warmup, a.iters, d.device)
    step_ms, step_min, peak = d.max_over_ranks(step_ms, step_min, torch.cuda.max_memory_allocated(d.device) / 2**30)
    if d.rank == 0:
        rt.emit("tp", size=a.size, d_model=shape.d_model, layers=shape.layers, parameters=shape.parameters(),
                precision=a.precision, attention=a.attention, ac=a.ac, ranks=d.world, tp=d.world,
                global_batch=a.batch, seq=shape.context, step_ms=step_ms, step_ms_min=step_min,
                tokens_per_s=a.batch * shape.context / step_ms * 1e3, peak_gib=round(peak, 3))
    d.close()
