"""mode `pp`: pipeline parallelism with torch.distributed.pipelining, one stage per rank.

Equal layer ranges per stage (stage 0 also embeds, the last stage holds the final norm, the LM head
and the loss), as lmscale's pp_xl_*.ini with 2 stages of 24 blocks; --batch (global) splits into
--microbatches, run by ScheduleGPipe or Schedule1F1B. torch.distributed.pipelining has no autocast:
in bf16 the stage's weights and activations are bf16 (norms, softmax and the loss in fp32), so the
peer holds no fp32 master weights, unlike lmscale (docs/performance.md says what that changes).
The report is the slowest stage's step and the largest stage's peak memory.
"""
import torch

from .. import runtime as rt
from ..model import PipelineStage, lm_loss


def run(a, shape):
    from torch.distributed.pipelining import PipelineStage as TorchStage
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    d = rt.Dist("nccl")
    r, p = d.rank, d.world
    if a.batch % a.microbatches:
        raise SystemExit(f"--batch {a.batch} does not split into {a.microbatches} microbatches")
    lo, hi = r * shape.layers // p, (r + 1) * shape.layers // p
    torch.manual_seed(r)
    mod = PipelineStage(shape, a.attention, lo, hi, r == 0, r == p - 1, a.ac).to(d.device)
    if a.precision == "bf16":
        mod = mod.to(torch.bfloat16)
    stage = TorchStage(mod, r, p, d.device)
    schedule_cls = Schedule1F1B if a.schedule == "1f1b" else ScheduleGPipe
    schedule = schedule_cls(stage, n_microbatches=a.microbatches, loss_fn=lm_loss)
    opt = rt.make_adamw(mod.parameters())
    x, y = rt.random_tokens(a.batch, shape.context, shape.vocab, d.device)

    def step():
        opt.zero_grad(set_to_none=True)
        if p == 1:
            schedule.step(x, target=y, losses=[])
        elif r == 0:
            schedule.step(x)
        elif r == p - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
        opt.step()

    rt.reset_peak(d.device)
    step_ms, step_min = rt.time_runs(step, a.warmup, a.iters, d.device)
    step_ms, step_min, peak = d.max_over_ranks(step_ms, step_min, torch.cuda.max_memory_allocated(d.device) / 2**30)
    if r == 0:
        rt.emit("pp", size=a.size, d_model=shape.d_model, layers=shape.layers, parameters=shape.parameters(),
                precision=a.precision, attention=a.attention, ac=a.ac, ranks=p, pp=p, schedule=a.schedule,
                microbatches=a.microbatches, global_batch=a.batch, seq=shape.context, step_ms=step_ms,
                step_ms_min=step_min, tokens_per_s=a.batch * shape.context / step_ms * 1e3,
                peak_gib=round(peak, 3))
    d.close()
