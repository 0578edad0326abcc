#!/usr/bin/env bash
# memory_prediction.sh LMSCALE OUTDIR [NP]: tiny bench-model decks on CPU in every bench mode and
# activation-checkpointing policy (naive and flash attention), one process, and with NP = 2 also
# DDP, zero1, zero2, fsdp and tp (with and without sequence parallelism) on 2 ranks and pipeline
# parallelism on 2 stages (gpipe, 1f1b, zb-h1, interleaved; 2 and 4 microbatches), and with NP = 4 fsdp
# over dp 2 x tp 2 (2D) and pipelines on dp 2 x pp 2 (ddp, zero2, fsdp) and tp 2 x pp 2 (with and
# without sequence parallelism); MoE models (one process, DDP, ep 2 on 2 ranks, ep 2 x zero2, ep 2 x
# fsdp and ep 4 on 4); fp8 under ddp, zero2, fsdp and fsdp with FP8 weight gathers on NP ranks. Each run's /bench_model/memory_prediction must hold every phase
# of its mode with a measured peak and a prediction within MAX_ERROR (0.5%; issue 21 asks for
# 5%), and so must every rank's rows in
# /bench_model/memory_prediction_ranks (a pipeline rank predicts its own stage) (issue 21). The CPU
# allocator counts the bytes it hands out, so the prediction can be checked exactly there.
# LAYERS (default 3) sets model.num_layers of a run, BATCH (default 4) its bench.batch_size; RUN_MAX_ERROR a run's bound (default MAX_ERROR).
set -u
LMSCALE=$1
OUT=$2
NP=${3:-1}
MAX_ERROR=${MEMORY_PREDICTION_MAX_ERROR:-0.005}   # 0.5%: the CPU allocator counts exactly (issue 21 asks for 5%)
mkdir -p "$OUT"
fail=0
deck="--run.job=bench-model --run.seed=1 --run.progress=false --model.vocab_size=512 --model.context_length=64
      --model.d_model=64 --model.d_ff=176 --model.num_heads=4 --parallel.device=cpu
      --bench.warmup=1 --bench.steps=1"

check() {   # NAME NP EXPECTED_PHASES... ; reads $OUT/NAME.h5
  local name=$1 np=$2
  shift 2
  python3 - "$OUT/$name.h5" "${RUN_MAX_ERROR:-$MAX_ERROR}" "$np" "$@" <<'PY'
import sys, h5py
path, limit, np, want = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
f = h5py.File(path, "r")
bad = 0
def row_ok(where, r):
    ok = r["measured_bytes"] > 0 and abs(r["error"]) <= limit
    print(f"  {where:<24} predicted {r['predicted_bytes']:12.0f}  measured {r['measured_bytes']:12.0f}  "
          f"error {100*r['error']:+7.3f}%  {'ok' if ok else 'FAIL'}")
    return ok
rows = {r["phase"].decode().rstrip("\0"): r for r in f["/bench_model/memory_prediction"][:]}
for p in want:
    if p not in rows:
        print(f"  {path}: no phase {p} in /bench_model/memory_prediction"); bad = 1; continue
    bad |= not row_ok(p, rows[p])
# Every rank's own prediction against its own peaks (rank 0's rows equal the table above).
ranks = {(int(r["rank"]), r["phase"].decode().rstrip("\0")): r for r in f["/bench_model/memory_prediction_ranks"][:]}
if np > 1:
    for rank in range(np):
        for p in want:
            if (rank, p) not in ranks:
                print(f"  {path}: no row (rank {rank}, {p}) in /bench_model/memory_prediction_ranks"); bad = 1; continue
            bad |= not row_ok(f"rank {rank} {p}", ranks[(rank, p)])
if len(ranks) != np * len(want):
    print(f"  {path}: {len(ranks)} rows in /bench_model/memory_prediction_ranks, expected {np * len(want)}"); bad = 1
sys.exit(bad)
PY
}

run() {   # NAME NP ARGS...
  local name=$1 np=$2
  shift 2
  local cmd=("$LMSCALE" $deck "--model.num_layers=${LAYERS:-3}" "--bench.batch_size=${BATCH:-4}" "$@" "--run.output=$OUT/$name.h5")
  [ "$np" -gt 1 ] && cmd=(mpirun -np "$np" --bind-to none "${cmd[@]}")
  if ! "${cmd[@]}" > "$OUT/$name.log" 2>&1; then
    echo "$name: lmscale failed"; tail -5 "$OUT/$name.log"; fail=1; return
  fi
  local phases=(init forward_backward optimizer)
  case "$*" in
    *bench.mode=forward-backward*) phases=(init forward_backward) ;;
    *bench.mode=forward\ *|*bench.mode=forward) phases=(init forward) ;;
  esac
  echo "$name"
  check "$name" "$np" "${phases[@]}" || fail=1
}

# Mixture of experts (memory_replay_moe.cpp): dropless the kept rows are N k exactly; with a
# capacity the replay takes the bound min(N k, B E capacity) (routing decides how many are kept:
# 1.4% over here); under expert parallelism each rank's experts are assumed to receive N k rows
# (balanced routing: within 1.4% here, either side).
moe="--model.moe_experts=4 --model.moe_top_k=2 --model.moe_expert_dff=48"
if [ "$NP" -eq 4 ]; then
  RUN_MAX_ERROR=0.03 BATCH=8 run "np4_moe_ep2_zero2" 4 $moe --parallel.ep=2 --parallel.zero=zero2 --bench.mode=train-step
  RUN_MAX_ERROR=0.03 BATCH=8 run "np4_moe_ep4_every1" 4 $moe --parallel.ep=4 --bench.mode=train-step \
      --train.activation_checkpointing=every-k
  # fsdp over the expert_dp groups of dp 2 x ep 2: each rank's units hold the dense weights and
  # its 2 experts, sharded over 2 ranks (the dense gradients' sum over ep is in place).
  RUN_MAX_ERROR=0.03 BATCH=8 run "np4_moe_ep2_fsdp" 4 $moe --parallel.ep=2 --parallel.zero=fsdp --bench.mode=train-step
  # 2D: fsdp over the dp axis of dp 2 x tp 2 (each tp rank's slices sharded over its dp group),
  # with and without sequence parallelism, forward and train-step; mixed-precision casts are
  # GPU-only and not replayed here.
  for mode in forward train-step; do
    run "np4_tp2_fsdp_${mode}" 4 --parallel.tp=2 --parallel.zero=fsdp --bench.mode=$mode
  done
  run "np4_tp2_fsdp_sp" 4 --parallel.tp=2 --parallel.zero=fsdp --parallel.sequence_parallel=true --bench.mode=train-step
  run "np4_tp2_fsdp_every1" 4 --parallel.tp=2 --parallel.zero=fsdp --bench.mode=train-step \
      --train.activation_checkpointing=every-k
  run "np4_tp2_fsdp_sp_every1_keep_attention" 4 --parallel.tp=2 --parallel.zero=fsdp --parallel.sequence_parallel=true \
      --bench.mode=train-step --train.activation_checkpointing=every-k --train.checkpoint_keep_attention=true \
      --model.attention=flash
  # ZeRO-2 over 4 ranks (uneven shards, each rank's received parts), gradients reduced in bf16.
  RUN_MAX_ERROR=0.001 run "np4_dp4_zero2_bf16" 4 --parallel.zero=zero2 --parallel.ddp=bucketed --parallel.bucket_mb=0.05 \
      --parallel.grad_reduce_dtype=bf16 --bench.mode=train-step
  # Pipelines on the mesh: dp 2 x pp 2 (zero2 in bucket_mb buckets, ddp's flat gradients) and
  # tp 2 x pp 2 (with and without sequence parallelism); each rank predicts its stage.
  pipe="--parallel.pp=2 --parallel.microbatches=2"
  for mode in forward train-step; do
    run "np4_dp2_pp2_zero2_1f1b_${mode}" 4 $pipe --parallel.dp=2 --parallel.schedule=1f1b --parallel.zero=zero2 \
        --parallel.ddp=bucketed --parallel.bucket_mb=0.1 --bench.mode=$mode
  done
  run "np4_dp2_pp2_ddp_gpipe" 4 $pipe --parallel.dp=2 --parallel.schedule=gpipe --parallel.ddp=flat --bench.mode=train-step
  # bf16 gradient reduction on dp 2 x pp 2: the last microbatch's backward makes the copies
  # (0.1%: without them the optimizer phase misses by 17%).
  RUN_MAX_ERROR=0.001 run "np4_dp2_pp2_zero2_bf16_1f1b" 4 $pipe --parallel.dp=2 --parallel.schedule=1f1b \
      --parallel.zero=zero2 --parallel.ddp=bucketed --parallel.bucket_mb=0.05 --parallel.grad_reduce_dtype=bf16 \
      --bench.mode=train-step
  RUN_MAX_ERROR=0.001 run "np4_dp2_pp2_zero2_flat_bf16_gpipe" 4 $pipe --parallel.dp=2 --parallel.schedule=gpipe \
      --parallel.zero=zero2 --parallel.ddp=flat --parallel.bucket_mb=0.05 --parallel.grad_reduce_dtype=bf16 \
      --bench.mode=train-step
  RUN_MAX_ERROR=0.001 run "np4_dp2_pp2_ddp_bf16_forward-backward" 4 $pipe --parallel.dp=2 --parallel.schedule=1f1b \
      --parallel.grad_reduce_dtype=bf16 --bench.mode=forward-backward
  LAYERS=4 RUN_MAX_ERROR=0.001 run "np4_dp2_pp2_overlap_bf16_interleaved" 4 $pipe --parallel.dp=2 \
      --parallel.schedule=interleaved --parallel.virtual_stages=2 --parallel.ddp=overlap \
      --parallel.grad_reduce_dtype=bf16 --bench.mode=train-step
  # fsdp over dp 2 x pp 2: each stage's units sharded over its dp group, gathered per microbatch
  # (with and without reshard_after_forward), reduce-scattered per microbatch (gpipe and 1f1b).
  for sched in gpipe 1f1b; do
    for reshard in true false; do
      run "np4_dp2_pp2_fsdp_${sched}_reshard_${reshard}" 4 $pipe --parallel.dp=2 --parallel.zero=fsdp \
          --parallel.schedule=$sched --parallel.reshard_after_forward=$reshard --bench.mode=train-step
    done
  done
  # 4 microbatches of one row (later ones reduce into a temporary shard), prefetch 2.
  LAYERS=4 BATCH=8 run "np4_dp2_pp2_fsdp_1f1b_m4_prefetch2" 4 --parallel.pp=2 --parallel.microbatches=4 \
      --parallel.dp=2 --parallel.zero=fsdp --parallel.schedule=1f1b --parallel.fsdp_prefetch=2 --bench.mode=train-step
  for mode in forward forward-backward; do
    run "np4_dp2_pp2_fsdp_1f1b_${mode}" 4 $pipe --parallel.dp=2 --parallel.zero=fsdp --parallel.schedule=1f1b \
        --bench.mode=$mode
  done
  for mode in forward train-step; do
    run "np4_tp2_pp2_1f1b_${mode}" 4 $pipe --parallel.tp=2 --parallel.schedule=1f1b --bench.mode=$mode
  done
  run "np4_tp2_pp2_sp_1f1b" 4 $pipe --parallel.tp=2 --parallel.sequence_parallel=true --parallel.schedule=1f1b \
      --bench.mode=train-step
  # zb-h1 on 4 stages (stage s keeps up to s + 1 microbatches' deferred products) and on tp 2 x
  # pp 2 with sequence parallelism (the products keep the gathered [N,d] rows).
  LAYERS=4 BATCH=8 run "np4_pp4_zb-h1_m8" 4 --parallel.pp=4 --parallel.microbatches=8 --parallel.schedule=zb-h1 \
      --bench.mode=train-step
  run "np4_tp2_pp2_sp_zb-h1" 4 $pipe --parallel.tp=2 --parallel.sequence_parallel=true --parallel.schedule=zb-h1 \
      --bench.mode=train-step
  RUN_MAX_ERROR=0.001 BATCH=8 run "np4_dp2_pp2_zero2_bf16_zb-h1_m4" 4 --parallel.pp=2 --parallel.microbatches=4 \
      --parallel.dp=2 --parallel.schedule=zb-h1 --parallel.zero=zero2 --parallel.ddp=bucketed --parallel.bucket_mb=0.05 \
      --parallel.grad_reduce_dtype=bf16 --bench.mode=train-step
  # 2 microbatches with 0.05 MiB buckets (once 0.9% under in the first stage's backward; exact
  # since, kept here so that it stays so).
  RUN_MAX_ERROR=0.001 run "np4_dp2_pp2_zero2_zb-h1_m2" 4 $pipe --parallel.dp=2 --parallel.schedule=zb-h1 \
      --parallel.zero=zero2 --parallel.ddp=bucketed --parallel.bucket_mb=0.05 --bench.mode=train-step
  LAYERS=4 run "np4_tp2_pp2_sp_interleaved" 4 $pipe --parallel.tp=2 --parallel.sequence_parallel=true \
      --parallel.schedule=interleaved --parallel.virtual_stages=2 --bench.mode=train-step
elif [ "$NP" -eq 1 ]; then
  for att in naive flash; do
    for mode in forward forward-backward train-step; do
      run "one_${att}_${mode}" 1 --model.attention=$att --bench.mode=$mode
    done
    for ac in selective selective-mlp; do
      run "one_${att}_${ac}" 1 --model.attention=$att --bench.mode=train-step --train.activation_checkpointing=$ac
    done
    run "one_${att}_every1" 1 --model.attention=$att --bench.mode=train-step --train.activation_checkpointing=every-k
    run "one_${att}_every2" 1 --model.attention=$att --bench.mode=train-step --train.activation_checkpointing=every-k \
        --train.checkpoint_k=2
    run "one_${att}_every2_keep_attention" 1 --model.attention=$att --bench.mode=train-step \
        --train.activation_checkpointing=every-k --train.checkpoint_k=2 --train.checkpoint_keep_attention=true
    run "one_${att}_every1_first1" 1 --model.attention=$att --bench.mode=train-step \
        --train.activation_checkpointing=every-k --train.checkpoint_layers=1
  done
  for mode in forward forward-backward train-step; do
    run "one_moe_${mode}" 1 $moe --bench.mode=$mode
  done
  run "one_moe_every1" 1 $moe --bench.mode=train-step --train.activation_checkpointing=every-k
  run "one_moe_every_other_block" 1 $moe --model.moe_every=2 --bench.mode=train-step
  RUN_MAX_ERROR=0.03 run "one_moe_capacity" 1 $moe --model.moe_capacity_factor=1 --bench.mode=train-step
  # precision.mode = fp8 (CPU emulation): each linear layer's saved x^T, w^T and scales, the
  # casts' temporaries, the scaling state; the recompute's replay keeps no new scales.
  for mode in forward forward-backward train-step; do
    run "one_fp8_${mode}" 1 --precision.mode=fp8 --bench.mode=$mode
  done
  for ac in selective selective-mlp every-k; do
    run "one_fp8_delayed_${ac}" 1 --precision.mode=fp8 --precision.fp8_scaling=delayed --bench.mode=train-step \
        --train.activation_checkpointing=$ac
  done
  run "one_fp8_every2_keep_attention" 1 --precision.mode=fp8 --model.attention=flash --bench.mode=train-step \
      --train.activation_checkpointing=every-k --train.checkpoint_k=2 --train.checkpoint_keep_attention=true
  run "one_fp8_offload" 1 --precision.mode=fp8 --parallel.offload=optimizer --bench.mode=train-step
  # The fused LM head in row chunks of 7 (256 rows: 36 chunks and a remainder of 4).
  for mode in forward train-step; do
    run "one_chunked_${mode}" 1 --model.attention=flash --model.ce_chunk_rows=7 --bench.mode=$mode
  done
else
  # precision.mode = fp8 under the data-parallel modes (the FP8 layers' memory is the same per rank).
  for z in "flat none" "bucketed zero2" "none fsdp"; do
    set -- $z
    run "np${NP}_fp8_$1_$2" "$NP" --precision.mode=fp8 --parallel.ddp=$1 --parallel.zero=$2 --parallel.bucket_mb=0.1 \
        --bench.mode=train-step
  done
  # fsdp's FP8 weight gathers: the blocks' gathered weights and send buffers in e4m3, no w cast in
  # the FP8 layers (with reshard_after_forward, without it, and with optimizer+params' staging).
  run "np${NP}_fp8_fsdp_gather_fp8" "$NP" --precision.mode=fp8 --parallel.zero=fsdp --parallel.fsdp_gather_dtype=fp8 \
      --bench.mode=train-step
  run "np${NP}_fp8_fsdp_gather_fp8_keep" "$NP" --precision.mode=fp8 --parallel.zero=fsdp \
      --parallel.fsdp_gather_dtype=fp8 --parallel.reshard_after_forward=false --bench.mode=train-step
  run "np${NP}_fp8_fsdp_gather_fp8_offload_params" "$NP" --precision.mode=fp8 --parallel.zero=fsdp \
      --parallel.fsdp_gather_dtype=fp8 --parallel.offload=optimizer+params --bench.mode=train-step
  run "np${NP}_moe_ddp" "$NP" $moe --parallel.ddp=flat --bench.mode=train-step
  RUN_MAX_ERROR=0.03 BATCH=8 run "np${NP}_moe_ep2" "$NP" $moe --parallel.ep=2 --bench.mode=train-step
  for z in "ddp flat none" "zero1 flat zero1" "zero2 bucketed zero2" "fsdp none fsdp"; do
    set -- $z
    for mode in forward train-step; do
      run "np${NP}_$1_${mode}" "$NP" --parallel.ddp=$2 --parallel.zero=$3 --parallel.bucket_mb=0.1 --bench.mode=$mode
    done
  done
  # Gradients reduced in bf16 (parallel.grad_reduce_dtype): the bf16 copies made per bucket
  # (overlap: per parameter; zero2 also this rank's received part) live to the step's end.
  # Checked at 0.1% (RUN_MAX_ERROR): leaving the copies out misses by 2.5% (zero2's backward
  # phase) to 15% (the optimizer phase of bucketed), which 5% would not all catch.
  # ddp none runs as flat (one copy, in finish()); zero2 makes its copies per bucket whatever
  # parallel.ddp says. forward-backward mode waits for the reduction too (finish() after the
  # phase mark: flat's copy and zero2's buckets show in the next step's phase).
  for z in "bucketed none" "overlap none" "bucketed zero2" "none none" "flat zero2"; do
    set -- $z
    RUN_MAX_ERROR=0.001 run "np${NP}_$1_$2_bf16_reduce" "$NP" --parallel.ddp=$1 --parallel.zero=$2 --parallel.bucket_mb=0.05 \
        --parallel.grad_reduce_dtype=bf16 --bench.mode=train-step
  done
  for z in "flat none bf16" "bucketed zero2 bf16" "bucketed zero2 fp32" "none fsdp fp32"; do
    set -- $z
    RUN_MAX_ERROR=0.001 run "np${NP}_$1_$2_$3_forward-backward" "$NP" --parallel.ddp=$1 --parallel.zero=$2 \
        --parallel.bucket_mb=0.05 --parallel.grad_reduce_dtype=$3 --bench.mode=forward-backward
  done
  # Tensor parallel (local shapes), with and without sequence parallelism.
  run "np${NP}_tp" "$NP" --parallel.tp=$NP --bench.mode=train-step
  run "np${NP}_tp_sp" "$NP" --parallel.tp=$NP --parallel.sequence_parallel=true --bench.mode=train-step
  # The fused LM head in row chunks of 7 under fsdp and the vocabulary-parallel head.
  run "np${NP}_fsdp_chunked" "$NP" --parallel.zero=fsdp --model.ce_chunk_rows=7 --bench.mode=train-step
  run "np${NP}_tp_sp_chunked" "$NP" --parallel.tp=$NP --parallel.sequence_parallel=true --model.ce_chunk_rows=7 \
      --bench.mode=train-step
  # Pipeline parallelism on NP stages: each rank replays its own stage under the schedule
  # (interleaved: 2 chunks per rank of a 4-layer model), 2 and 4 microbatches, forward and
  # train-step, and a checkpointing policy whose every-k groups are cut at the stage boundary.
  for sched in gpipe 1f1b zb-h1 interleaved; do
    layers=3 extra=""
    [ "$sched" = interleaved ] && layers=4 extra="--parallel.virtual_stages=2"
    for M in 2 4; do
      for mode in forward train-step; do
        LAYERS=$layers run "np${NP}_pp_${sched}_m${M}_${mode}" "$NP" --parallel.pp=$NP --parallel.schedule=$sched \
            --parallel.microbatches=$M $extra --bench.mode=$mode
      done
    done
  done
  # zb-h1: each backward's weight-gradient products deferred to its W pass (their inputs and
  # output gradients alive until then), here under selective checkpointing (recomputed norms kept).
  LAYERS=4 run "np${NP}_pp_zb-h1_selective" "$NP" --parallel.pp=$NP --parallel.schedule=zb-h1 --parallel.microbatches=4 \
      --train.activation_checkpointing=selective --model.attention=flash --bench.mode=train-step
  run "np${NP}_pp_1f1b_m4_forward-backward" "$NP" --parallel.pp=$NP --parallel.schedule=1f1b --parallel.microbatches=4 \
      --bench.mode=forward-backward
  LAYERS=4 run "np${NP}_pp_1f1b_every3" "$NP" --parallel.pp=$NP --parallel.schedule=1f1b --parallel.microbatches=4 \
      --train.activation_checkpointing=every-k --train.checkpoint_k=3 --bench.mode=train-step
  LAYERS=4 run "np${NP}_pp_1f1b_every1_keep_attention" "$NP" --parallel.pp=$NP --parallel.schedule=1f1b \
      --parallel.microbatches=4 --train.activation_checkpointing=every-k --train.checkpoint_keep_attention=true \
      --model.attention=flash --bench.mode=train-step
  LAYERS=4 run "np${NP}_pp_interleaved_first1_keep_attention" "$NP" --parallel.pp=$NP --parallel.schedule=interleaved \
      --parallel.virtual_stages=2 --parallel.microbatches=4 --train.activation_checkpointing=every-k \
      --train.checkpoint_layers=1 --train.checkpoint_keep_attention=true --model.attention=flash --bench.mode=train-step
  LAYERS=4 run "np${NP}_pp_interleaved_selective" "$NP" --parallel.pp=$NP --parallel.schedule=interleaved \
      --parallel.virtual_stages=2 --parallel.microbatches=4 --train.activation_checkpointing=selective \
      --model.attention=flash --bench.mode=train-step
fi
exit $fail
