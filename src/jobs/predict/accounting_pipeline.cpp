// Accounting of a pipeline-parallel deck (parallel.pp > 1; jobs/predict/accounting.h): per-rank memory of
// the stage that needs the most, the bytes each rank sends per step (activations and their
// gradients between stages, plus the data-parallel gradient traffic of its stage) and the
// theoretical bubble. Same memory model as account() for one rank (parameters fp32 + bf16 copy,
// gradients, AdamW state, activations per block as model/recompute.h keeps them), applied to a
// stage's parameters and blocks, with the microbatches in flight at the start of the backward:
// gpipe M on every stage, 1f1b min(p - s, M) on stage s. Tensor-parallel stages (tp x pp): the
// stage's parameters as one tp rank holds them (sliced, norms whole), activations with q, k, v,
// o, a, b, g split 1/tp and the residual stream replicated (or 1/tp under sequence
// parallelism, as are the transfers between stages), plus the stage's tp collectives. fsdp
// stages (over dp): the stage's units sharded over its dp group (master, gradient and state
// shards, gathered units), all-gathers and reduce-scatters per microbatch. These
// components are a formula (what a stage holds at the start of its first backward); the exact
// per-phase peaks of every stage come from replaying its schedule (memory_model_pipeline.cpp),
// which the accounting job prints and stores per stage beside them.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "lmscale/jobs/predict/accounting.h"
#include "lmscale/jobs/predict/device_peak.h"
#include "lmscale/parallel/spec.h"
#include "lmscale/jobs/predict/parallel_bounds.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/recompute.h"
#include "lmscale/model/stage.h"
#include "lmscale/parallel/pipeline.h"
#include "memory_replay.h"

namespace lmscale::jobs {

Accounting account_pipeline(const Config& cfg, int world, const std::string& device_name) {
  Accounting best;
  const auto m = model::ModelDims::from(cfg.model);
  const bool bench = cfg.run.job == JobKind::bench_model;
  const std::int64_t B = bench ? cfg.bench.batch_size : cfg.train.batch_size;
  const int pp = static_cast<int>(cfg.parallel.pp), M = static_cast<int>(cfg.parallel.microbatches);
  const parallel::Spec spec = parallel::Spec::resolve(cfg.parallel, world);   // the deck's layout
  const comm::MeshShape mesh = spec.mesh_shape();
  const int tp = mesh.tp, dp = mesh.dp;
  const bool sp = tp > 1 && cfg.parallel.sequence_parallel;
  // One tp rank's parameter sizes (the full ones with tp = 1), in parameter_layout order.
  model::TensorSplit split;
  split.degree = tp;
  split.sequence_parallel = sp;
  const auto layout = model::tensor_parallel_layout(m, split);
  const bool interleaved = cfg.parallel.schedule == PipelineSchedule::interleaved;
  const int V = interleaved ? static_cast<int>(cfg.parallel.virtual_stages) : 1;
  const auto overrides = cfg.parallel.stage_layers;
  const bool mixed = computes_16bit(cfg.precision.mode, cfg.parallel.device != DeviceChoice::cpu);
  const double e = mixed ? 2.0 : 4.0;
  const bool sharded = spec.sharded_optimizer(), fsdp = spec.fsdp();
  const std::int64_t local = B / dp, micro_rows = std::max<std::int64_t>(1, local / M);
  const double b = static_cast<double>(micro_rows), T = static_cast<double>(m.context), N = b * T,
               d = static_cast<double>(m.d_model), F = static_cast<double>(m.d_ff), H = static_cast<double>(m.heads),
               Vocab = static_cast<double>(m.vocab);
  // r: the share of the residual-stream tensors (x, y1, h, y2, rstd) a tp rank holds.
  const double r = sp ? 1.0 / tp : 1.0;
  const double attn = (m.flash ? b * H * T * 4 : b * H * T * T * e) / tp;
  const double block = (4 * d * r + (4 * d + 3 * F) / tp) * N * e + 2 * N * 4 * r + attn;
  for (int s = 0; s < pp; ++s) {
    Accounting a;
    // The stage's chunks (one unless interleaved); in flight: chunk-microbatches whose
    // activations are kept at the start of the first backward (Megatron's warm-up + 1).
    const auto chunks = model::pipeline_chunks(m, pp, V, s, overrides);
    double P = 0, Ls = 0;
    bool head = false, embed = false;
    for (const auto& u : chunks) {
      for (int i = u.first_param(m); i < u.end_param(m); ++i) P += static_cast<double>(layout[static_cast<std::size_t>(i)].numel);
      Ls += u.end_layer(m) - u.first_layer();
      head = head || u.owns_head(m);
      embed = embed || u.owns_embedding();
    }
    const double inflight =
        cfg.parallel.schedule == PipelineSchedule::gpipe ? M
        : interleaved ? std::min(M * V, (pp - s - 1) * 2 + (V - 1) * pp + 1) / static_cast<double>(V)
                      : std::min(pp - s, M);   // 1f1b and zb-h1
    // zb-h1: besides 1f1b's p - s microbatches between forward and B, those whose B ran and whose
    // W waits (W(i) after B(i + s): min(s, steady) of them) keep per block the weight-gradient
    // products' inputs and output gradients (memory_replay_deferred.cpp): the copied (or, under
    // sequence parallelism, gathered) [n,d] output gradients of w2 and o, the [n,d] y1 and y2, and
    // g, da|db, o, dq|dk|dv: (4d + (4d + 3F)/tp) n e.
    const double deferred_micro =
        cfg.parallel.schedule == PipelineSchedule::zb_h1 ? std::min(s, M - std::min(pp - s - 1, M)) : 0.0;
    a.parameters = static_cast<std::int64_t>(P);
    a.local_batch = micro_rows;
    a.seq = m.context;
    auto add = [&](std::string name, double bytes, std::string f) { a.memory.push_back({std::move(name), bytes, std::move(f)}); };
    const double state_b = cfg.optim.name == OptimizerName::sgd || cfg.optim.name == OptimizerName::lars ? 4 : 8;   // one or two fp32 states
    // fsdp stages (over dp, tp = 1): the stage's units (embedding, blocks, head) sharded over its
    // dp group, the norms (2d per block, d final) replicated.
    const double unit_block = 4 * d * d + 3 * d * F;
    const double norms = 2 * d * Ls + (head ? d : 0.0), Ps = P - norms;
    if (fsdp) {
      add("parameters", 4 * Ps / dp + 4 * norms, "4 B x Ps_stage / dp (fp32 master shard of the stage's units, Ps_stage = "
                                                 "P_stage - norms) + replicated norms");
      add("gradients", 4 * norms, "replicated norm gradients (each unit's full-size gradients live only from its "
                                  "backward to its reduce-scatter, per microbatch)");
      add("gradient_shard", 4 * Ps / dp, "4 B x Ps_stage / dp (fp32)");
      add("optimizer_state", state_b * (Ps / dp + norms),
          fmt::format("{} B x (Ps_stage / dp + norms) (of this rank's shard and of the norms)", state_b));
      // Gathered at once: the head unit (the last stage: kept from its forward through its
      // backward) and the prefetched blocks with their cast shards; without reshard_after_forward
      // every unit of the stage stays gathered from a forward to the backward.
      add("fsdp_gathered", e * ((head ? Vocab * d : 0.0) + cfg.parallel.fsdp_prefetch * unit_block * (1 + 1.0 / dp)) +
                               (cfg.parallel.reshard_after_forward ? 0.0 : e * (Ls * unit_block + (embed ? Vocab * d : 0.0))),
          cfg.parallel.reshard_after_forward
              ? "e x (head unit V d on the last stage + prefetch x block 4d^2 + 3dF, and its cast shard)"
              : "e x (every unit of the stage: kept from the forward to the backward) + e x (head + prefetch x block)");
    } else {
      add("parameters", 4 * P, tp > 1 ? "4 B x P_stage (fp32 master of this tp rank's slices of the stage's units)"
                                       : "4 B x P_stage (fp32 master of this stage's units)");
      if (mixed) add("parameters_lowp", 2 * P, "2 B x P_stage (bf16/fp16 working copy)");
      if (spec.grad_storage() == parallel::GradStorage::lazy_buckets)
        add("gradients", 0, "0 at the start of the backward (per-bucket buffers, allocated as the backward goes)");
      else
        add("gradients", 4 * P, "4 B x P_stage (one flat fp32 buffer)");
      if (spec.gradient_shard()) add("gradient_shard", 4 * P / dp, "4 B x P_stage / dp");
      add("optimizer_state", state_b * P / (sharded ? dp : 1),
          sharded ? fmt::format("{} B x P_stage / dp", state_b) : fmt::format("{} B x P_stage (optimizer state)", state_b));
    }
    const Checkpointing ac = cfg.train.activation_checkpointing;
    const bool ac_keeps_attention = ac == Checkpointing::every_k && cfg.train.checkpoint_keep_attention;
    double per_micro = Ls * block;
    double c = 0;   // every-k: the stage's checkpointed blocks (train.checkpoint_layers, as the model cuts them)
    if (ac == Checkpointing::every_k) {
      const model::RecomputePolicy policy = model::RecomputePolicy::from(cfg.train);
      for (const auto& u : chunks) c += policy.checkpointed_end(u.first_layer(), u.end_layer(m)) - u.first_layer();
    }
    // every-k: blocks per group, at most the checkpointed ones (as in the one-process formula).
    const double k = std::min<double>(static_cast<double>(cfg.train.checkpoint_k), c);
    // every-k with checkpoint_keep_attention: what each checkpointed block keeps besides its group
    // input (its attention output and aux), which the recomputed group does not materialise again.
    const double kept_attn = ac_keeps_attention ? N * d * e / tp + attn : 0.0;
    std::string f = tp > 1 ? "L_stage x ((4d r + (4d + 3F)/tp) n e + 8n r + attention aux/tp), n = b_micro T, r = "
                             "1 (1/tp with sequence parallelism)"
                           : "L_stage x ((8d + 3F) n e + 8n + attention aux), n = b_micro T";
    if (ac == Checkpointing::every_k) {
      per_micro = (k > 0 ? std::ceil(c / k) : 0.0) * N * d * e * r + (Ls - c) * block;
      f = "ceil(c/k) n d e (group inputs of the c checkpointed blocks) + (L_stage - c) x block, + one group recomputed";
      if (ac_keeps_attention) {   // each checkpointed block's attention output and aux stay too
        per_micro += c * kept_attn;
        f = "ceil(c/k) n d e (group inputs of the c checkpointed blocks) + c x (n d e/tp + attention aux) (kept "
            "attention) + (L_stage - c) x block, + one group recomputed";
      }
    } else if (ac == Checkpointing::selective || ac == Checkpointing::selective_mlp) {
      const double kf = ac == Checkpointing::selective ? 2 : 0;   // [n,F] tensors kept per block (a, b)
      // kept: x, h (residual stream), q, k, v, o (split), a, b (split).
      per_micro = Ls * ((2 * d * r + (4 * d + kf * F) / tp) * N * e + 2 * N * 4 * r + (m.flash ? attn : 0.0));
      f = kf > 0 ? "L_stage x ((6d + 2F) n e + 8n [+ lse])" : "L_stage x (6d n e + 8n [+ lse])";
    }
    // The head stage: the fused LM head + cross-entropy keeps only the gradient of its input
    // [n,d] per microbatch in flight; one row chunk of logits, the final norm's output and its
    // gradient exist while a microbatch's head runs.
    const double chunk =
        static_cast<double>(m.head_chunk_rows(static_cast<std::int64_t>(N), m.vocab / tp, mixed ? 2 : 4));
    add("activations", inflight * (per_micro + (head ? N * d * e * r : 0.0)) +
                           (head ? chunk * Vocab / tp * e + N * d * e * r + N * d * e : 0.0) +
                           (ac == Checkpointing::every_k ? k * (block - kept_attn) : 0.0) +
                           deferred_micro * Ls * (4 * d + (4 * d + 3 * F) / tp) * N * e,
        fmt::format("{:.3g} microbatches in flight x ({}{}){}{}", inflight, f, head ? " + n d e (head input gradient)" : "",
                    head ? " + chunk V e + 2 n d e (one chunk of logits, final norm output and gradient)" : "",
                    ac_keeps_attention ? "; the recomputed group: k x (block - kept attention)" : "") +
            (deferred_micro > 0 ? fmt::format(" + {:.3g} microbatches' deferred weight-gradient products x L_stage x "
                                              "(4d + (4d + 3F)/tp) n e (zb-h1)",
                                              deferred_micro)
                                : std::string()));
    for (const auto& it : a.memory) a.peak_bytes += it.bytes;
    // p2p: every microbatch sends each chunk's output [n, d] forward (not from the last virtual
    // stage) and each chunk's input gradient [n, d] backward (not from virtual stage 0).
    // (tp x pp: each tp rank sends its copy, or under sequence parallelism its row shard.)
    const double p2p = M * N * d * e * r * ((V - (s + 1 == pp ? 1.0 : 0.0)) + (V - (s == 0 ? 1.0 : 0.0)));
    const double G = 4 * P, fr = dp > 1 ? static_cast<double>(dp - 1) / dp : 0.0;
    if (fsdp) {
      // Per microbatch over the stage's dp group: every unit gathered for its forward and, with
      // reshard_after_forward, the blocks again for their backward (the head's backward runs in
      // its forward, the embedding's reads no weights); every unit's gradients reduce-scattered.
      // Once per step: the norms' all-reduce.
      const bool reshard = cfg.parallel.reshard_after_forward;
      a.comm_bytes_per_step = p2p + M * fr * (e * (Ps + (reshard ? Ls * unit_block : 0.0)) + 4 * Ps) + 2 * fr * 4 * norms;
      a.comm_formula = fmt::format(
          "M x n d e per direction between stages (activations forward, gradients backward) + per microbatch over dp: "
          "all-gather (dp-1)/dp x e {} + reduce-scatter (dp-1)/dp x 4 Ps_stage; + all-reduce of the norms 2 (dp-1)/dp x "
          "4 norms",
          reshard ? "(Ps_stage + L_stage x block) (forward; the blocks again for the backward)"
                  : "Ps_stage (units kept from the forward to the backward)");
    } else {
      a.comm_bytes_per_step = p2p + 2 * fr * G + (spec.broadcast_update() ? G / dp : 0.0);
      a.comm_formula = fmt::format("M x n d e{} per direction between stages (activations forward, gradients "
                                   "backward){}", sp ? "/tp" : "",
                                   dp > 1 ? " + data-parallel gradients of the stage: 2 (dp-1)/dp x 4 P_stage" : "");
    }
    // The stage's tp collectives over its M microbatches (counted for L_stage blocks plus the
    // embedding's and the head's, which only the first and the last stage run: coarse by two).
    model::ModelDims stage_dims = m;
    stage_dims.layers = static_cast<std::int64_t>(Ls);
    const auto tpc = tensor_parallel_comm(stage_dims, static_cast<double>(local) * T, tp, sp, e, ac == Checkpointing::every_k);
    a.tp_comm_bytes_per_step = tpc.bytes;
    a.tp_comm_formula = tpc.formula;
    if (a.peak_bytes > best.peak_bytes) best = a;
  }
  best.parameters = m.parameter_count();   // the model's (the memory items count the stage's)
  best.flops_per_step = m.train_flops_per_token(m.context) * static_cast<double>(B * m.context);
  best.flops_per_step_causal = m.train_flops_per_token_causal(m.context) * static_cast<double>(B * m.context);
  best.peak_flops = device_peak_flops(device_name.empty() ? "NVIDIA H100 80GB HBM3" : device_name, cfg.precision.mode,
                                      cfg.precision.tf32);
  // Every rank computes 1/(dp tp pp) of the FLOPs, idle for the schedule's theory bubble of the step.
  const double bubble = parallel::schedule_theory_bubble(cfg.parallel.schedule, pp, M, V).fraction;
  best.ideal_step_s = best.peak_flops > 0 ? best.flops_per_step / (dp * tp * pp * best.peak_flops) / (1 - bubble) : 0;
  best.comm_formula += fmt::format("; ideal step includes the bubble {:.3f}", bubble);
  return best;
}

}  // namespace lmscale::jobs
