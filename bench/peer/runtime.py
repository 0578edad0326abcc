"""What every mode shares: the device, timing, distributed start-up, the optimizer and the report.

Timing matches lmscale's bench jobs: `warmup` untimed runs, then `iters` timed runs, each ended by a
device synchronisation; the report gives the median (and the minimum) in ms.
"""
import json
import os
import resource
import statistics
import time

import torch


def pick_device(name):
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible (use --device cpu for a smoke run)")
    return torch.device(name)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runs(fn, warmup, iters, device):
    """Median and minimum wall time of fn in ms over `iters` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device):
    """Peak bytes allocated by PyTorch's caching allocator, in GiB (None on the CPU)."""
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 3)


def emit(mode, **fields):
    """One JSON object per measured case on stdout: the format bench/ratio_table.py reads."""
    rec = {"peer": "torch", "torch": torch.__version__, "mode": mode}
    rec.update(fields)
    # This process's peak resident set (Linux: ru_maxrss in KiB), as lmscale's host_peak_resident_bytes.
    rec.setdefault("host_peak_gib", round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3))
    print(json.dumps(rec), flush=True)


def autocast(device, precision):
    """bf16 mixed precision as lmscale's precision.mode = bf16: fp32 master weights, bf16 GEMMs."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def make_adamw(params, lr=1e-4):
    """AdamW as lmscale's (decoupled weight decay); fused where this build has it."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01, foreach=True)


def random_tokens(batch, seq, vocab, device, seed=0):
    """Uniform token ids and targets, as lmscale's bench-model draws them: timings must not depend on data."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randint(0, vocab, (batch, seq), generator=g)
    y = torch.randint(0, vocab, (batch, seq), generator=g)
    return x.to(device), y.to(device)


class Dist:
    """torch.distributed started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK in the environment)."""

    def __init__(self, backend="nccl"):
        import torch.distributed as dist
        if "RANK" not in os.environ:
            raise SystemExit("this mode runs under torchrun (torchrun --nproc-per-node N bench/torch_peer.py ...)")
        self.dist = dist
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if backend == "nccl":
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (docs/architecture.md §3)
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
        dist.init_process_group(backend, device_id=self.device if backend == "nccl" else None)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def max_over_ranks(self, *values):
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.tolist()

    def close(self):
        self.dist.barrier()
        self.dist.destroy_process_group()
