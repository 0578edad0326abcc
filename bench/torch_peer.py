#!/usr/bin/env python3
"""The PyTorch peer of lmscale: the same model (docs/architecture.md §2), attention, collectives and
parallel modes, timed the way lmscale's bench jobs time them. Run it on the same GPUs as the
lmscale job it is compared with (bench/study_*.sh do both and print the ratio table).
Every mode prints one JSON object per measured case (median ms, tokens/s, peak GiB).

  python3 bench/torch_peer.py model --size xl --precision bf16 [--compile] [--attention sdpa]
  python3 bench/torch_peer.py attention --batch 1 --heads 16 --seq 16384 --head-dim 64 --dtype bf16 --causal
  torchrun --nproc-per-node 2 bench/torch_peer.py collectives --backend nccl
  torchrun --nproc-per-node 2 bench/torch_peer.py ddp --size xl --precision bf16 --batch 4      # per rank
  torchrun --nproc-per-node 2 bench/torch_peer.py fsdp --size xl --precision bf16 --batch 8 [--ac] [--offload]
  torchrun --nproc-per-node 2 bench/torch_peer.py tp --size 2.7B --precision bf16 --batch 4
  torchrun --nproc-per-node 2 bench/torch_peer.py pp --size xl --precision bf16 --batch 8 --microbatches 8 --schedule 1f1b
  python3 bench/torch_peer.py moe --experts 8 --top-k 2 [--grouped]   # torchrun: expert parallel
  python3 bench/torch_peer.py check --weights W.h5 --tokens TOKENS     # float64 loss of lmscale weights

Shapes: --size picks an lmscale preset; --d-model, --d-ff, --layers, --heads, --vocab override it
(tiny CPU smoke runs: --device cpu on `model`).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SIZES = ("small", "medium", "large", "xl", "2.7B", "8b")
LM_MODES = ("model", "ddp", "fsdp", "tp", "pp")


def _timing(p):
    p.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    p.add_argument("--iters", type=int, default=10, help="timed runs; the report is their median (default 10)")


def _lm_args(p):
    p.add_argument("--size", default="small", choices=SIZES, help="lmscale model.size preset")
    for flag in ("--d-model", "--d-ff", "--layers", "--heads", "--vocab"):
        p.add_argument(flag, type=int, default=None, help="override the preset")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--attention", default="naive", choices=("naive", "sdpa"),
                   help="naive = lmscale's default; sdpa ~ lmscale's model.attention = flash")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512, help="tokens per sequence (lmscale's model.context_length)")
    p.add_argument("--ac", action="store_true", help="recompute every block in the backward (activation checkpointing)")
    _timing(p)


def parser():
    top = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="mode", required=True)
    helps = {"model": "the LM on one device (bench-model)", "ddp": "DistributedDataParallel (torchrun)",
             "fsdp": "FSDP2 fully_shard (torchrun)", "tp": "DTensor Megatron tensor parallelism (torchrun)",
             "pp": "torch.distributed.pipelining (torchrun)"}
    lm = {m: sub.add_parser(m, help=helps[m]) for m in LM_MODES}
    for p in lm.values():
        _lm_args(p)
    compile_as = lm["model"].add_mutually_exclusive_group()
    compile_as.add_argument("--compile", action="store_true", help="torch.compile the model")
    compile_as.add_argument("--compile-blocks", action="store_true",
                            help="torch.compile each transformer block on its own (regional compilation: the "
                                 "blocks share one compiled graph, so xl compiles in a fraction of --compile's "
                                 "time; the embedding, final norm and LM head run eager)")
    lm["model"].add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    lm["model"].add_argument("--step-only", action="store_true",
                             help="time the train step only (forward_ms is null): under --compile the no-grad "
                                  "forward is a second compilation, minutes for xl with --float8")
    lm["model"].add_argument("--float8", action="store_true",
                             help="the blocks' linear layers in FP8 by torchao (tensorwise dynamic scaling; "
                                  "needs torchao and a Hopper GPU; the LM head stays bf16)")
    lm["ddp"].add_argument("--bucket-mb", type=float, default=25, help="DDP bucket_cap_mb (default 25)")
    lm["fsdp"].add_argument("--offload", action="store_true", help="CPUOffloadPolicy: state in host memory, CPU AdamW")
    lm["pp"].add_argument("--microbatches", type=int, default=8)
    lm["pp"].add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b"))

    at = sub.add_parser("attention", help="one attention call (bench-attention)")
    for flag, default in (("--batch", 1), ("--heads", 16), ("--seq", 16384), ("--head-dim", 64)):
        at.add_argument(flag, type=int, default=default)
    at.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    at.add_argument("--causal", action="store_true")
    at.add_argument("--impl", default="sdpa,naive", help="comma list of sdpa, naive")
    at.add_argument("--passes", default="forward,backward,forward-backward")
    at.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    _timing(at)

    co = sub.add_parser("collectives", help="collective bandwidth (bench-collectives, torchrun)")
    co.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    co.add_argument("--ops", default="all-reduce", help="comma list: all-reduce, reduce-scatter, all-gather, broadcast")
    co.add_argument("--dtypes", default="fp32", help="comma list: fp32, bf16, fp16")
    co.add_argument("--min-bytes", default="1M")
    co.add_argument("--max-bytes", default="1G")
    co.add_argument("--step-factor", type=int, default=10)
    _timing(co)

    mo = sub.add_parser("moe", help="mixture of experts, 1 GPU or expert parallel (torchrun)")
    for flag, default in (("--d-model", 1024), ("--layers", 12), ("--heads", 16), ("--vocab", 10000), ("--experts", 8),
                          ("--top-k", 2), ("--expert-dff", 2816), ("--batch", 8), ("--seq", 1024)):
        mo.add_argument(flag, type=int, default=default)
    mo.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    mo.add_argument("--attention", default="sdpa", choices=("naive", "sdpa"))
    mo.add_argument("--ac", action="store_true")
    mo.add_argument("--grouped", action="store_true", help="experts by torch._grouped_mm (bf16, CUDA)")
    mo.add_argument("--lr", type=float, default=1e-4,
                    help="AdamW learning rate, constant (default 1e-4; lmscale's optim.lr, its peak, is 1e-3): the "
                         "router's balance loss evens the experts' load at this rate")
    mo.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    _timing(mo)

    ck = sub.add_parser("check", help="float64 loss of an lmscale weights file on tokens")
    ck.add_argument("--weights", "--checkpoint", required=True, help="HDF5 written by train.save")
    ck.add_argument("--tokens", required=True, help=".npy [rows, T+1], or a raw token file")
    ck.add_argument("--tokens-dtype", default="uint16", choices=("uint16", "uint32", "int32"))
    ck.add_argument("--context", type=int, default=0, help="tokens per row - 1 (default: the file's context_length)")
    ck.add_argument("--rows", type=int, default=0, help="use the first ROWS rows (default all)")
    ck.add_argument("--heads", type=int, default=0, help="default: the file's num_heads")
    return top


def main(argv=None):
    a = parser().parse_args(argv)
    if a.mode in LM_MODES:
        from peer.model import shape_from
        shape = shape_from(a.size, a.seq, d_model=a.d_model, d_ff=a.d_ff, layers=a.layers, heads=a.heads,
                           vocab=a.vocab)
    if a.mode == "model":
        from peer.modes import single
        single.run(a, shape)
    elif a.mode in ("ddp", "fsdp"):
        from peer.modes import data_parallel
        (data_parallel.run_ddp if a.mode == "ddp" else data_parallel.run_fsdp)(a, shape)
    elif a.mode == "tp":
        from peer.modes import tensor_parallel
        tensor_parallel.run(a, shape)
    elif a.mode == "pp":
        from peer.modes import pipeline
        pipeline.run(a, shape)
    else:
        import importlib
        importlib.import_module(f"peer.modes.{a.mode}").run(a)


if __name__ == "__main__":
    main()
