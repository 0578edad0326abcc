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
  // Of backward_s, the blocks' matmul weight gradients (q, k, v, out, w1, w2, w3): the W pass
  // that zb-h1 defers (PipelineParallel; the norms', embedding's, head's and an MoE FFN's stay in B).
  double weight_s = 0;
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
  // Mixture of experts (docs/moe.md): E experts of inner size Fe, top-k, in the blocks
  // model::ModelDims::is_moe_block names; ep ranks split the experts (the deck refuses MoE with
  // tp or pp > 1, so those terms below never meet an MoE block).
  const int ep = spec.ep;
  const double E = static_cast<double>(m.moe_experts), k_top = static_cast<double>(m.moe_top_k),
               Fe = static_cast<double>(m.moe_dff);
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
  // An MoE block's FFN, balanced routing (every expert takes n k / E of this rank's assignments,
  // none dropped): the router GEMM [n, d] x [d, E]; per local expert (E / ep of them) the SwiGLU
  // GEMMs over the n k ep / E rows it receives from the ep ranks (w1, w3: [rows, d] x [d, Fe]; w2:
  // [rows, Fe] x [Fe, d]), each at the calibrated rate of a call that size; the permutation and
  // the gated combine (read and write n k rows of d each) and the experts' SwiGLU (3 n k Fe) in
  // place of the dense FFN's elementwise share (3 F per token).
  // With ep > 1 every block's combine waits for its busiest ep rank (docs/moe.md, "Where ep = 2
  // loses its time"): that rank's experts take plan.moe_rank_imbalance x the mean rows, so their
  // products are timed at that size (the FLOPs reported stay the mean rank's).
  const double imbalance = ep > 1 ? cfg.plan.moe_rank_imbalance : 1.0;
  const double assignments = n * k_top, expert_rows = assignments * ep / std::max(E, 1.0);
  const double expert_gemm = 2 * expert_rows * d * Fe, router_gemm = 2 * n * d * E;
  const double busiest_expert_gemm = imbalance * expert_gemm;
  const double moe_elementwise_bytes = elementwise_bytes + (3 * k_top * Fe + 4 * k_top * d - 3 * F) * e * n;
  auto block = [&](Work& w, bool forward, bool backward, const std::string& prefix, bool skip_attention,
                   bool gemms_w1w3_only, bool moe_block) {
    for (const Gemm& g : gemms) {
      const bool ffn = std::string(g.op) == "gemm w1 w3" || std::string(g.op) == "gemm w2";
      if ((gemms_w1w3_only && std::string(g.op) != "gemm w1 w3") || (moe_block && ffn)) continue;
      const double f = 2 * n * g.K * g.N;
      if (forward) w.add(prefix + g.op, g.count * f, 0, g.count * gemm_s(f), false);
      if (backward) {
        w.add(g.op, 2 * g.count * f, 0, 2 * g.count * gemm_s(f), true);
        w.weight_s += g.count * gemm_s(f);   // dW: one of the two backward products
      }
    }
    if (moe_block) {
      const double local = E / ep, calls = gemms_w1w3_only ? 2.0 : 3.0;
      const double f = local * calls * expert_gemm, s = local * calls * gemm_s(busiest_expert_gemm);
      if (forward) w.add(prefix + "gemm experts", f, 0, s, false);
      if (backward) w.add("gemm experts", 2 * f, 0, 2 * s, true);
      if (!gemms_w1w3_only) {
        if (forward) w.add(prefix + "gemm router", router_gemm, 0, gemm_s(router_gemm), false);
        if (backward) w.add("gemm router", 2 * router_gemm, 0, 2 * gemm_s(router_gemm), true);
      }
    }
    if (gemms_w1w3_only) return;
    if (forward && !skip_attention) w.add(prefix + "attention", attn_forward, 0, attn_s / 3.5, false);
    if (backward) w.add("attention", 2.5 * attn_forward, 0, attn_s * 2.5 / 3.5, true);
    const double eb = moe_block ? moe_elementwise_bytes : elementwise_bytes;
    if (forward) w.add(prefix + "elementwise", 0, eb, stream_s(eb, kForwardLaunchesPerBlock), false);
    if (backward) w.add("elementwise", 0, 2 * eb, stream_s(2 * eb, kBackwardLaunchesPerBlock), true);
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
      const bool moe_block = m.is_moe_block(l);
      block(w, true, true, "", false, false, moe_block);
      // Recompute in the backward: every-k repeats the forward of the checkpointed blocks (keeping
      // the attention output skips its attention); selective repeats the elementwise part,
      // selective-mlp also w1 and w3.
      if (l - l0 < checkpointed) {
        Work rc;
        block(rc, true, false, "", cfg.train.checkpoint_keep_attention, false, moe_block);
        for (auto& [k, o] : rc.ops) w.add("recompute", o.flops, o.bytes, o.seconds, true);
      } else if (ac == Checkpointing::selective || ac == Checkpointing::selective_mlp) {
        w.add("recompute", 0, elementwise_bytes, stream_s(elementwise_bytes, kForwardLaunchesPerBlock), true);
        if (ac == Checkpointing::selective_mlp) {
          Work rc;
          block(rc, true, false, "", true, true, moe_block);
          for (auto& [k, o] : rc.ops) w.add("recompute", o.flops, o.bytes, o.seconds, true);
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
  int stage_moe_blocks = 0, stage_checkpointed_moe = 0;   // the slowest stage's MoE blocks (pp = 1 with MoE)
  {
    const int base = layers / pp, extra = layers % pp, s = static_cast<int>(slowest);
    const int l0 = s * base + std::min(s, extra), l1 = l0 + stage_layers;
    const int checkpointed = ac == Checkpointing::every_k ? policy.checkpointed_end(l0, l1) - l0 : 0;
    for (int l = l0; l < l1; ++l)
      if (m.is_moe_block(l)) ++stage_moe_blocks, stage_checkpointed_moe += l - l0 < checkpointed ? 1 : 0;
  }

  // Placement of the mesh (comm::Mesh: tp adjacent, then dp, then pp) on nodes of gpn GPUs.
  const Placement tp_group{tp, std::min(tp, gpn)};
  // The data-parallel strategy's group: dp ranks, or with expert parallelism the dp / ep ranks
  // holding the same experts (stride ep); the ep group: ep consecutive ranks of a dp group.
  const int gg = spec.gradient_group();
  const Placement dp_group{gg, std::clamp(gpn / (tp * ep), 1, gg)};
  const Placement ep_group{ep, std::clamp(gpn / tp, 1, ep)};
  const bool pp_inter = dp * tp * pp > gpn;
  auto add_comm = [&](CommTime c) {
    if (c.seconds <= 0) return;   // a group of one rank (dp / ep = 1) or no bytes: nothing moves
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
  // Expert parallelism: each MoE block's dispatch and combine are all-to-alls of this rank's
  // n k rows of d (counts first: a few bytes, counted in alpha), twice in the forward, twice in the
  // backward, twice more in the recompute of a checkpointed block; on the critical path. The
  // busiest rank receives and returns `imbalance` x the mean rows, and every rank waits for it.
  double ep_per_microbatch = 0;
  if (ep > 1 && stage_moe_blocks > 0) {
    const double bytes = imbalance * assignments * d * e;
    const CollectiveTime one = collective_time(CollectiveOp::all_to_all, bytes, ep_group, cluster);
    const double count = 4.0 * stage_moe_blocks + 2.0 * stage_checkpointed_moe;
    ep_per_microbatch = count * one.seconds;
    add_comm({"all-to-all", "ep", "MoE dispatch and combine", one.algorithm, one.inter_node, count * steps, bytes,
              count * steps * one.seconds, count * steps * one.seconds, 0});
  }
  const double microbatch_s = w.forward_s + w.backward_s + tp_per_microbatch + pp_per_microbatch + ep_per_microbatch;
  out.compute_s = steps * (w.forward_s + w.backward_s);
  // The bubble: the schedule's idle time for passes of this stage's length (parallel::
  // pipeline_idle), the transfers and tp/ep collectives of a micro-batch counted with its forward
  // and B; zb-h1's W is the blocks' weight-gradient GEMMs.
  out.bubble_s = spec.bubble_idle(static_cast<int>(M), static_cast<int>(cfg.parallel.virtual_stages),
                                  microbatch_s - w.backward_s, w.backward_s - w.weight_s, w.weight_s);

  // Data parallelism over the dp group: parameters this rank holds (tp slices of its stage).
  // An MoE block holds the router (E d) and its E / ep local experts (3 d Fe each) in place of the
  // dense FFN.
  const double block_params = 4 * d * d + 3 * d * F, norms = (2 * stage_layers + 1) * d;
  const double moe_block_params = 4 * d * d + E * d + E / ep * 3 * d * Fe;
  const double stage_matrix = (stage_layers - stage_moe_blocks) * block_params + stage_moe_blocks * moe_block_params +
                              (pp == 1 ? 2 : 1) * V * d;
  const double held = stage_matrix / t + norms;   // Pr of the accounting, for this stage
  const double grad_e = cfg.parallel.grad_reduce_dtype == GradReduceDtype::bf16 ? 2.0 : 4.0;
  const bool copy_engine = spec.copy_engine_window() != parallel::CopyEngineWindow::none;
  const double contention = copy_engine ? cal.copy_engine_contention : cal.nccl_contention;
  const double last_backward_s = w.backward_s;
  if (ep > 1 && dp > 1) {
    // The dense gradients are first summed over the ep group (parallel/expert_parallel_strategy.h),
    // as each becomes final in the last micro-batch's backward: hidden behind it but for the last
    // block's (counted like a bucket's tail). fsdp reduce-scatters every micro-batch's gradients,
    // so their dense parts are summed over ep in every micro-batch, each hidden behind its own
    // backward but for its last block's.
    const double dense = held - stage_moe_blocks * E / ep * 3 * d * Fe;
    const double times = spec.fsdp() ? steps : 1.0;
    const CollectiveTime c = collective_time(CollectiveOp::all_reduce, grad_e * dense, ep_group, cluster);
    const double tail = collective_time(CollectiveOp::all_reduce, grad_e * dense / std::max(1, stage_layers), ep_group,
                                        cluster).seconds;
    const double hidden = std::min(std::max(0.0, c.seconds - tail), last_backward_s);
    add_comm({"all-reduce", "ep", "dense gradients over the ep group", c.algorithm, c.inter_node, times, grad_e * dense,
              times * c.seconds, times * (c.seconds - hidden), times * contention * hidden});
  }
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
      // A block unit's parameters, averaged over the stage's blocks (an MoE block's unit holds its
      // router and this ep rank's E / ep experts), over the gradient group (expert_dp under ep).
      const double unit = ((stage_layers - stage_moe_blocks) * block_params + stage_moe_blocks * moe_block_params) /
                          std::max(1, stage_layers) / t;
      // parallel.fsdp_gather_dtype = fp8: a block's weights travel in e4m3 (1 B per element), each
      // gather after an all-reduce of its 7 fp32 amaxes, which the cast waits for (exposed).
      const bool fp8_gather = cfg.parallel.fsdp_gather_dtype == FsdpGatherDtype::fp8;
      const double ge = fp8_gather ? 1.0 : e;
      const CollectiveTime ag = collective_time(CollectiveOp::all_gather, ge * unit, dp_group, cluster);
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
      add_comm({"all-gather", "dp", "fsdp unit gathers", ag.algorithm, ag.inter_node, gathers * units, ge * unit,
                ag_s + bwd_ag_s, ag_exposed, contention * (ag_s + bwd_ag_s - ag_exposed)});
      if (fp8_gather) {
        const CollectiveTime am = collective_time(CollectiveOp::all_reduce, 7 * 4, dp_group, cluster);
        add_comm({"all-reduce", "dp", "fsdp FP8 gathers' amaxes", am.algorithm, am.inter_node, gathers * units, 7 * 4,
                  gathers * units * am.seconds, gathers * units * am.seconds, 0.0});
      }
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
  const double owned = spec.fsdp() ? stage_matrix / t / gg + norms : held / (spec.sharded_optimizer() ? gg : 1);
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
