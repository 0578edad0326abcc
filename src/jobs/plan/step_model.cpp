#include "lmscale/jobs/plan/step_model.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "lmscale/jobs/plan/collective_model.h"
#include "lmscale/jobs/predict/parallel_bounds.h"
#include "lmscale/model/model_dims.h"
#include "lmscale/model/recompute.h"
#include "lmscale/parallel/spec.h"

namespace lmscale::jobs::plan {

namespace {

// Kernel launches of one block per micro-batch beside its GEMMs and attention: ~1500 launches per
// xl step of 48 blocks (docs/performance.md, "xl on one GPU") is 31 per block, forward + backward.
constexpr double kForwardLaunchesPerBlock = 10, kBackwardLaunchesPerBlock = 21;
// The fp32 FFMA peak of H100/H200 (datasheets) against their bf16 peak: fp32 decks' GEMM rates.
constexpr double kFp32OverBf16 = 66.9 / 989.4;

// Per-op seconds of one micro-batch on one stage, forward and backward apart.
struct Work {
  std::map<std::string, OpTime> ops;   // by op name, summed
  double forward_s = 0, backward_s = 0;
  void add(const std::string& op, double flops, double bytes, double s, bool backward) {
    OpTime& o = ops[op];
    o.op = op, o.flops += flops, o.bytes += bytes, o.seconds += s;
    (backward ? backward_s : forward_s) += s;
  }
};

}  // namespace

StepPrediction predict_step(const Config& cfg, std::int64_t batch, int gpus, const Cluster& cluster,
                            const Calibration& cal) {
  StepPrediction out;
  const auto m = model::ModelDims::from(cfg.model);
  const parallel::Spec spec = parallel::Spec::resolve(cfg.parallel, gpus);
  const int dp = spec.dp, tp = spec.tp, pp = spec.pp, gpn = cluster.gpus_per_node;
  const bool fp32 = cfg.precision.mode == PrecisionMode::fp32;
  const double e = fp32 ? 4.0 : 2.0, t = static_cast<double>(tp);
  const double d = static_cast<double>(m.d_model), F = static_cast<double>(m.d_ff), H = static_cast<double>(m.heads),
               T = static_cast<double>(m.context), V = static_cast<double>(m.vocab),
               Dh = static_cast<double>(m.head_dim());
  const bool sp = tp > 1 && spec.sequence_parallel;
  // The calibrated device's rates, scaled to the cluster's peak and memory bandwidth.
  const double flop_scale = (fp32 ? kFp32OverBf16 : 1.0) * cluster.bf16_flops / cal.peak_flops;
  const double bw_scale = cluster.hbm_bytes_per_s / cal.hbm_bytes_per_s;
  auto gemm_s = [&](double flops) { return flops / (cal.gemm.rate(flops) * flop_scale); };
  auto attention_s = [&](double flops) { return flops / (cal.attention.rate(flops) * flop_scale); };
  auto stream_s = [&](double bytes, double launches) {
    return bytes / (cal.elementwise_bytes_per_s * bw_scale) + launches * cal.launch_gap_s;
  };

  // Micro-batches: the pipeline's, else gradient accumulation's; b sequences of T tokens each.
  const std::int64_t M = pp > 1 ? std::max<std::int64_t>(1, cfg.parallel.microbatches)
                                : std::max<std::int64_t>(1, cfg.train.grad_accum);
  const double b = static_cast<double>(batch) / dp / static_cast<double>(M), n = b * T;
  out.microbatches = M;
  out.microbatch_sequences = b;

  // One block of one micro-batch on this tp rank: GEMMs [n, K] x [K, N] (backward: dx and dW, each
  // the forward's FLOPs), causal attention (backward 2.5x the forward), elementwise traffic.
  struct Gemm {
    const char* op;
    double count, K, N;
  };
  const Gemm gemms[] = {{"gemm qkv", 3, d, d / t}, {"gemm out", 1, d / t, d}, {"gemm w1 w3", 2, d, F / t},
                        {"gemm w2", 1, F / t, d}};
  const double r = sp ? 1.0 / t : 1.0;
  const double elementwise_bytes = (10 * d * r + (4 * d + 3 * F) / t) * e * n;   // forward; backward twice
  const double attn_forward = 4 * b * (H / t) * T * T * Dh / 2;
  const double attn_call = 3.5 * attn_forward, attn_s = attention_s(attn_call);
  auto block = [&](Work& w, bool forward, bool backward, const std::string& prefix, bool skip_attention,
                   bool gemms_w1w3_only) {
    for (const Gemm& g : gemms) {
      if (gemms_w1w3_only && std::string(g.op) != "gemm w1 w3") continue;
      const double f = 2 * n * g.K * g.N;
      if (forward) w.add(prefix + g.op, g.count * f, 0, g.count * gemm_s(f), false);
      if (backward) w.add(g.op, 2 * g.count * f, 0, 2 * g.count * gemm_s(f), true);
    }
    if (gemms_w1w3_only) return;
    if (forward && !skip_attention) w.add(prefix + "attention", attn_forward, 0, attn_s / 3.5, false);
    if (backward) w.add("attention", 2.5 * attn_forward, 0, attn_s * 2.5 / 3.5, true);
    if (forward) w.add(prefix + "elementwise", 0, elementwise_bytes, stream_s(elementwise_bytes, kForwardLaunchesPerBlock), false);
    if (backward)
      w.add("elementwise", 0, 2 * elementwise_bytes, stream_s(2 * elementwise_bytes, kBackwardLaunchesPerBlock), true);
  };
  // Stages: balanced blocks (the first stages take the remainder); stage 0 holds the embedding,
  // the last the final norm and the fused LM head + cross-entropy (its backward runs in the forward).
  const int layers = static_cast<int>(m.layers);
  const auto policy = model::RecomputePolicy::from(cfg.train);
  const Checkpointing ac = cfg.train.activation_checkpointing;
  auto stage_work = [&](int s) {
    Work w;
    const int base = layers / pp, extra = layers % pp;
    const int l0 = s * base + std::min(s, extra), l1 = l0 + base + (s < extra ? 1 : 0);
    const int checkpointed = ac == Checkpointing::every_k ? policy.checkpointed_end(l0, l1) - l0 : 0;
    for (int l = l0; l < l1; ++l) {
      block(w, true, true, "", false, false);
      // Recompute in the backward: every-k repeats the forward of the checkpointed blocks (keeping
      // the attention output skips its attention); selective repeats the elementwise part,
      // selective-mlp also w1 and w3.
      if (l - l0 < checkpointed) {
        Work rc;
        block(rc, true, false, "", cfg.train.checkpoint_keep_attention, false);
        for (auto& [k, o] : rc.ops) w.add("recompute", o.flops, o.bytes, o.seconds, true);
      } else if (ac == Checkpointing::selective || ac == Checkpointing::selective_mlp) {
        w.add("recompute", 0, elementwise_bytes, stream_s(elementwise_bytes, kForwardLaunchesPerBlock), true);
        if (ac == Checkpointing::selective_mlp) {
          const double f = 2 * n * d * F / t;
          w.add("recompute", 2 * f, 0, 2 * gemm_s(f), true);
        }
      }
    }
    if (s == 0) w.add("elementwise", 0, n * d * (e + 8), stream_s(n * d * (e + 8), 3), false);   // embedding
    if (s == pp - 1) {
      const double f = 2 * n * d * V / t, ce = 3 * n * V / t * e;
      w.add("gemm head", 3 * f, 0, 3 * gemm_s(f), false);
      w.add("cross-entropy", 0, ce, stream_s(ce, 6), false);
    }
    return w;
  };
  std::size_t slowest = 0;
  std::vector<Work> stages;
  for (int s = 0; s < pp; ++s) {
    stages.push_back(stage_work(s));
    const Work& w = stages.back();
    if (w.forward_s + w.backward_s > stages[slowest].forward_s + stages[slowest].backward_s) slowest = stages.size() - 1;
  }
  const Work& w = stages[slowest];
  const int stage_layers = layers / pp + (static_cast<int>(slowest) < layers % pp ? 1 : 0);

  // Placement of the mesh (comm::Mesh: tp adjacent, then dp, then pp) on nodes of gpn GPUs.
  const Placement tp_group{tp, std::min(tp, gpn)};
  const Placement dp_group{dp, std::clamp(gpn / tp, 1, dp)};
  const bool pp_inter = dp * tp * pp > gpn;
  auto add_comm = [&](CommTime c) {
    out.comm_s += c.seconds;
    out.exposed_comm_s += c.exposed_s;
    out.overlapped_comm_s += c.seconds - c.exposed_s;
    out.contention_s += c.contention_s;
    out.comm.push_back(std::move(c));
  };
  const double steps = static_cast<double>(M);

  // Tensor parallelism: its collectives sit on the critical path of every micro-batch (the
  // accounting's counts for this stage's blocks; every-k repeats the forward's).
  double tp_per_microbatch = 0;
  if (tp > 1) {
    model::ModelDims stage_dims = m;
    stage_dims.layers = stage_layers;
    const auto tc = tensor_parallel_comm(stage_dims, n, tp, sp, e, ac == Checkpointing::every_k);
    const double act = n * d * e;
    auto tp_comm = [&](CollectiveOp op, int count, double bytes) {
      if (count == 0) return;
      const CollectiveTime one = collective_time(op, bytes, tp_group, cluster);
      const double s = one.seconds * count * steps;
      tp_per_microbatch += one.seconds * count;
      add_comm({to_string(op), "tp", "activations", one.algorithm, one.inter_node, count * steps, bytes, s, s, 0});
    };
    tp_comm(CollectiveOp::all_reduce, tc.all_reduces, act);
    tp_comm(CollectiveOp::all_gather, tc.all_gathers, act);
    tp_comm(CollectiveOp::reduce_scatter, tc.reduce_scatters, act);
  }
  // Pipeline: each micro-batch sends its activations forward and their gradients back (one
  // transfer each way on the critical path per micro-batch).
  double pp_per_microbatch = 0;
  if (pp > 1) {
    const double bytes = n * d * e * r;
    const CollectiveTime one = p2p_time(bytes, pp_inter, cluster);
    pp_per_microbatch = 2 * one.seconds;
    add_comm({"p2p", "pp", "activations and their gradients", "p2p", pp_inter, 2 * steps, bytes,
              2 * steps * one.seconds, 2 * steps * one.seconds, 0});
  }
  const double microbatch_s = w.forward_s + w.backward_s + tp_per_microbatch + pp_per_microbatch;
  out.compute_s = steps * (w.forward_s + w.backward_s);
  out.bubble_s = spec.bubble_microbatches(static_cast<int>(cfg.parallel.virtual_stages)) * microbatch_s;

  // Data parallelism over the dp group: parameters this rank holds (tp slices of its stage).
  const double block_params = 4 * d * d + 3 * d * F, norms = (2 * stage_layers + 1) * d;
  const double stage_matrix = stage_layers * block_params + (pp == 1 ? 2 : 1) * V * d;
  const double held = stage_matrix / t + norms;   // Pr of the accounting, for this stage
  const double grad_e = cfg.parallel.grad_reduce_dtype == GradReduceDtype::bf16 ? 2.0 : 4.0;
  const bool copy_engine = spec.copy_engine_window() != parallel::CopyEngineWindow::none;
  const double contention = copy_engine ? cal.copy_engine_contention : cal.nccl_contention;
  const double last_backward_s = w.backward_s;
  switch (spec.gradient_timing()) {
    case parallel::GradientTiming::none: break;
    case parallel::GradientTiming::after_backward: {
      const CollectiveOp op = spec.gradient_collective();
      const CollectiveTime c = collective_time(op, grad_e * held, dp_group, cluster);
      add_comm({to_string(op), "dp", "gradients", c.algorithm, c.inter_node, 1, grad_e * held, c.seconds, c.seconds, 0});
      break;
    }
    case parallel::GradientTiming::during_backward: {
      // Buckets reduce beside the last micro-batch's backward; the last bucket waits alone.
      const CollectiveOp op = spec.gradient_collective();
      const CollectiveTime c = collective_time(op, grad_e * held, dp_group, cluster);
      const double bucket = std::min(held * grad_e, spec.bucket_mb * 1024 * 1024);
      const double tail = collective_time(op, bucket, dp_group, cluster).seconds;
      const double hidden = std::min(std::max(0.0, c.seconds - tail), last_backward_s);
      add_comm({to_string(op), "dp", "gradients (bucketed, beside the backward)", c.algorithm, c.inter_node,
                std::ceil(held * grad_e / bucket), grad_e * held, c.seconds, c.seconds - hidden, contention * hidden});
      break;
    }
    case parallel::GradientTiming::per_unit: {
      // fsdp: per block and micro-batch, the forward's all-gather beside the previous block's
      // forward, the backward's all-gather and reduce-scatter beside the next block's backward.
      const double unit = block_params / t;
      const CollectiveTime ag = collective_time(CollectiveOp::all_gather, e * unit, dp_group, cluster);
      const CollectiveTime rs = collective_time(CollectiveOp::reduce_scatter, 4 * unit, dp_group, cluster);
      const double gathers = cfg.parallel.reshard_after_forward ? 2.0 : 1.0;
      const double fwd_block = w.forward_s / std::max(1, stage_layers), bwd_block = w.backward_s / std::max(1, stage_layers);
      // Exposed share of each window's collectives: what outlasts the block computing beside them.
      const double fwd_comm = ag.seconds, bwd_comm = (gathers - 1) * ag.seconds + rs.seconds;
      const double fwd_exposed = fwd_comm > 0 ? std::max(0.0, fwd_comm - fwd_block) / fwd_comm : 0.0;
      const double bwd_exposed = bwd_comm > 0 ? std::max(0.0, bwd_comm - bwd_block) / bwd_comm : 0.0;
      const double units = stage_layers * steps;   // block units per step
      const double ag_s = units * ag.seconds, bwd_ag_s = (gathers - 1) * ag_s, rs_s = units * rs.seconds;
      const double ag_exposed = ag_s * fwd_exposed + bwd_ag_s * bwd_exposed;
      add_comm({"all-gather", "dp", "fsdp unit gathers", ag.algorithm, ag.inter_node, gathers * units, e * unit,
                ag_s + bwd_ag_s, ag_exposed, contention * (ag_s + bwd_ag_s - ag_exposed)});
      add_comm({"reduce-scatter", "dp", "fsdp unit gradients", rs.algorithm, rs.inter_node, units, 4 * unit, rs_s,
                rs_s * bwd_exposed, contention * rs_s * (1 - bwd_exposed)});
      // The embedding and head units (V d / tp each): the first gather waits alone.
      const CollectiveTime emb = collective_time(CollectiveOp::all_gather, e * V * d / t, dp_group, cluster);
      add_comm({"all-gather", "dp", "fsdp embedding/head gathers", emb.algorithm, emb.inter_node, steps, e * V * d / t,
                steps * emb.seconds, emb.seconds, contention * (steps - 1) * emb.seconds});
      break;
    }
  }
  if (spec.gathers_parameters_after_step() || spec.broadcast_update()) {
    const CollectiveOp op = spec.broadcast_update() ? CollectiveOp::broadcast : CollectiveOp::all_gather;
    const double bytes = spec.broadcast_update() ? 4 * held : e * held;
    const CollectiveTime c = collective_time(op, bytes, dp_group, cluster);
    const bool overlapped = cfg.parallel.overlap_param_gather && !spec.broadcast_update();
    add_comm({to_string(op), "dp", "updated parameters", c.algorithm, c.inter_node, 1, bytes, c.seconds,
              overlapped ? 0.0 : c.seconds, overlapped ? contention * c.seconds : 0.0});
  }

  // Optimizer: AdamW and the gradient norm over the parameters this rank owns.
  const double owned = spec.fsdp() ? stage_matrix / t / dp + norms : held / (spec.sharded_optimizer() ? dp : 1);
  const double opt_bytes = owned * cal.optimizer_bytes_per_param;
  out.optimizer_s = opt_bytes / (cal.optimizer_bytes_per_s * bw_scale);

  for (const auto& [k, o] : w.ops) out.compute.push_back({o.op, steps * o.flops, steps * o.bytes, steps * o.seconds});
  if (spec.offload != OffloadMode::none) {
    // fsdp with parallel.offload = optimizer (parallel/offloaded_shards.h; the deck checks refuse
    // the other modes under run.job = plan): the host updates the shard while the next step's
    // first micro-batch runs its forward, which waits for each unit's update; the node's ranks
    // share the host's memory bandwidth. The device only computes the norm (its read, 4 B).
    const int node_ranks = std::min(gpus, cluster.gpus_per_node);
    const double host_bytes = owned * cal.host_adamw_bytes_per_param;
    const double update_s = host_bytes * node_ranks / cal.host_adamw_bytes_per_s;
    const double norm_s = 4 * owned / (cal.optimizer_bytes_per_s * bw_scale);
    out.compute.push_back({"host optimizer (overlaps the forward)", 0, host_bytes, update_s});
    out.compute.push_back({"gradient norm", 0, 4 * owned, norm_s});
    out.optimizer_s = norm_s + std::max(0.0, update_s - w.forward_s);
  } else {
    out.compute.push_back({"optimizer", 0, opt_bytes, out.optimizer_s});
  }
  out.step_s = out.compute_s + out.bubble_s + out.exposed_comm_s + out.contention_s + out.optimizer_s;
  const double tokens = static_cast<double>(batch) * T;
  out.tokens_per_s_per_gpu = tokens / out.step_s / gpus;
  out.flops_per_step = m.train_flops_per_token(m.context) * tokens;
  out.mfu = out.flops_per_step / (out.step_s * gpus * cluster.bf16_flops);
  return out;
}

}  // namespace lmscale::jobs::plan
