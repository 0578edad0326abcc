"""mode `collectives`: torch.distributed collectives like lmscale's bench-collectives
(inputs/collectives_nccl.ini, collectives_mpi.ini), one rank per GPU (nccl) or per process (gloo).

Sizes follow lmscale's sweep: min_bytes, times step_factor, up to max_bytes; `bytes` is the whole
buffer (nccl-tests' convention: the output of all-gather, the input of reduce-scatter). Time is the
average of `iters` back-to-back calls; algbw = bytes / time, busbw = algbw x (all-reduce 2(n-1)/n,
reduce-scatter and all-gather (n-1)/n, broadcast 1), as lmscale and nccl-tests report them.
"""
import time

import torch

from .. import runtime as rt

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_bytes(text):
    text = text.strip().upper().removesuffix("B")
    unit = text[-1] if text and text[-1] in UNITS else ""
    return int(float(text[:len(text) - len(unit)]) * UNITS[unit])


def sweep(lo, hi, factor):
    sizes, b = [], lo
    while b <= hi:
        sizes.append(b)
        b *= factor
    return sizes


def bus_factor(op, n):
    return {"all-reduce": 2 * (n - 1) / n, "reduce-scatter": (n - 1) / n, "all-gather": (n - 1) / n,
            "broadcast": 1.0}[op]


def make_call(d, op, nbytes, dt, device):
    es = torch.tensor([], dtype=dt).element_size()
    n = nbytes // es // d.world * d.world
    big = torch.ones(n, dtype=dt, device=device)
    small = torch.ones(n // d.world, dtype=dt, device=device)
    calls = {"all-reduce": lambda: d.dist.all_reduce(big),
             "reduce-scatter": lambda: d.dist.reduce_scatter_tensor(small, big),
             "all-gather": lambda: d.dist.all_gather_into_tensor(big, small),
             "broadcast": lambda: d.dist.broadcast(big, src=0)}
    return calls[op], n * es


def run(a):
    d = rt.Dist(a.backend)
    for op in a.ops.split(","):
        for dname in a.dtypes.split(","):
            for size in sweep(parse_bytes(a.min_bytes), parse_bytes(a.max_bytes), a.step_factor):
                call, nbytes = make_call(d, op, size, DTYPES[dname], d.device)
                for _ in range(a.warmup):
                    call()
                rt.synchronize(d.device)
                d.dist.barrier()
                t0 = time.perf_counter()
                for _ in range(a.iters):
                    call()
                rt.synchronize(d.device)
                secs = (time.perf_counter() - t0) / a.iters
                (secs,) = d.max_over_ranks(secs)
                algbw = nbytes / secs / 1e9
                if d.rank == 0:
                    rt.emit("collectives", op=op, backend=a.backend, dtype=dname, ranks=d.world, bytes=size,
                            buffer_bytes=nbytes,
                            time_ms=secs * 1e3, time_us=secs * 1e6, algbw_gbs=algbw,
                            busbw_gbs=algbw * bus_factor(op, d.world))
                del call
    d.close()
