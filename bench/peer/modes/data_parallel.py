"""modes `ddp` and `fsdp`: data parallelism over all ranks of a torchrun launch, one GPU each.

ddp  -- torch DistributedDataParallel (bucketed all-reduce overlapped with the backward, bucket
        --bucket-mb), bf16 autocast; --batch is the batch of ONE rank (DDP's view), as lmscale's
        ddp_xl_*.ini decks with 4 sequences per rank (global 8 on 2 GPUs).
fsdp -- FSDP2 (`fully_shard`, ZeRO-3): one unit per block plus the root, parameters gathered in
        bf16 and gradients reduced in fp32 (MixedPrecisionPolicy), resharded after the forward like
        lmscale's reshard_after_forward = true; --batch is GLOBAL (split over ranks), as in
        inputs/fsdp_xl*.ini and leaderboard_8b.ini. --ac recomputes every block (lmscale's
        activation_checkpointing = every-k, checkpoint_k = 1); --offload keeps the sharded
        parameters, gradients and AdamW state in pinned host memory (CPUOffloadPolicy, CPU AdamW).
"""
import torch

from .. import runtime as rt
from ..model import TransformerLM, lm_loss


def _report(a, d, mode, shape, global_batch, step_ms, step_min, **extra):
    (peak,) = d.max_over_ranks(torch.cuda.max_memory_allocated(d.device) / 2**30)
    if d.rank == 0:
        rt.emit(mode, size=a.size, d_model=shape.d_model, layers=shape.layers, parameters=shape.parameters(),
                precision=a.precision, attention=a.attention, ac=a.ac, ranks=d.world, global_batch=global_batch,
                seq=shape.context, step_ms=step_ms, step_ms_min=step_min,
                tokens_per_s=global_batch * shape.context / step_ms * 1e3, peak_gib=round(peak, 3), **extra)


def run_ddp(a, shape):
    from torch.nn.parallel import DistributedDataParallel

    d = rt.Dist("nccl")
    torch.manual_seed(0)
    model = TransformerLM(shape, a.attention, a.ac).to(d.device)
    ddp = DistributedDataParallel(model, device_ids=[d.local_rank], bucket_cap_mb=a.bucket_mb)
    opt = rt.make_adamw(model.parameters())
    x, y = rt.random_tokens(a.batch, shape.context, shape.vocab, d.device, seed=d.rank)

    def step():
        opt.zero_grad(set_to_none=True)
        with rt.autocast(d.device, a.precision):
            loss = lm_loss(ddp(x), y)
        loss.backward()
        opt.step()

    rt.reset_peak(d.device)
    step_ms, step_min = rt.time_runs(step, a.warmup, a.iters, d.device)
    (step_ms, step_min) = d.max_over_ranks(step_ms, step_min)
    _report(a, d, "ddp", shape, a.batch * d.world, step_ms, step_min, local_batch=a.batch, bucket_mb=a.bucket_mb)
    d.close()


def run_fsdp(a, shape):
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    d = rt.Dist("nccl")
    if a.batch % d.world:
        raise SystemExit(f"--batch {a.batch} (global) does not split over {d.world} ranks")
    torch.manual_seed(0)
    model = TransformerLM(shape, a.attention, a.ac).to(d.device)
    if a.precision == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    offload = CPUOffloadPolicy() if a.offload else OffloadPolicy()
    for blk in model.layers:
        fully_shard(blk, mp_policy=mp, reshard_after_forward=True, offload_policy=offload)
    fully_shard(model, mp_policy=mp, offload_policy=offload)
    opt = rt.make_adamw(model.parameters())
    x, y = rt.random_tokens(a.batch // d.world, shape.context, shape.vocab, d.device, seed=d.rank)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()

    rt.reset_peak(d.device)
    step_ms, step_min = rt.time_runs(step, a.warmup, a.iters, d.device)
    (step_ms, step_min) = d.max_over_ranks(step_ms, step_min)
    _report(a, d, "fsdp", shape, a.batch, step_ms, step_min, offload=a.offload)
    d.close()
