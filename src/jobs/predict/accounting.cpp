#include "lmscale/jobs/predict/accounting.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "lmscale/io/deck.h"
#include "lmscale/jobs/predict/cost_estimate.h"
#include "lmscale/jobs/predict/device_peak.h"
#include "lmscale/jobs/predict/memory_model.h"
#include "lmscale/jobs/predict/planned_device.h"
#include "lmscale/model/fp8_layers.h"
#include "lmscale/model/model_dims.h"
#include "lmscale/model/recompute.h"
#include "lmscale/parallel/copy_engine_all_to_all.h"
#include "lmscale/parallel/spec.h"
#include "lmscale/parallel/strategy.h"
#include "memory_replay.h"

namespace lmscale::jobs {

Accounting account(const Config& cfg, int world, const std::string& device_name) {
  // CS336 §8: where each strategy becomes communication bound on the [accounting] machine.
  auto analysis = [&](Accounting& a) {
    a.analysis_flops = cfg.accounting.device_tflops > 0
                           ? cfg.accounting.device_tflops * 1e12
                           : device_peak_flops(device_name.empty() ? "NVIDIA H100 80GB HBM3" : device_name,
                                               cfg.precision.mode, cfg.precision.tf32);
    a.analysis_link_bytes = cfg.accounting.link_gbps * 1e9;
    if (a.analysis_flops > 0) a.bounds = parallel_bounds(cfg, a.analysis_flops, a.analysis_link_bytes);
  };
  if (cfg.parallel.pp > 1) {
    Accounting a = account_pipeline(cfg, world, device_name);
    analysis(a);
    return a;
  }
  Accounting a;
  const auto m = model::ModelDims::from(cfg.model);
  const double P = static_cast<double>(m.parameter_count());
  a.parameters = m.parameter_count();
  const bool bench = cfg.run.job == JobKind::bench_model;
  const std::int64_t B = bench ? cfg.bench.batch_size : cfg.train.batch_size;
  // The deck's layout (the accounting job may describe a layout other than the one it runs on).
  const parallel::Spec spec = parallel::Spec::resolve(cfg.parallel, world);
  const comm::MeshShape mesh = spec.mesh_shape();
  const int tp = mesh.tp, dp = mesh.dp;
  const bool sp = tp > 1 && cfg.parallel.sequence_parallel;
  a.local_batch = B / dp / (bench ? 1 : cfg.train.grad_accum);
  a.seq = m.context;
  const bool mixed = computes_16bit(cfg.precision.mode, cfg.parallel.device != DeviceChoice::cpu);
  const double e = mixed ? 2.0 : 4.0;   // activation bytes per element
  const bool sharded = spec.sharded_optimizer();
  const bool fsdp = spec.fsdp();
  // parallel.fsdp_gather_dtype = fp8: the blocks' weights gather in e4m3 (1 B), the embedding and
  // head units in e (docs/parallel.md, "FP8 weight gathers").
  const bool fp8_gather = fsdp && cfg.parallel.fsdp_gather_dtype == FsdpGatherDtype::fp8;
  const double N = static_cast<double>(a.local_batch * a.seq), d = static_cast<double>(m.d_model),
               F = static_cast<double>(m.d_ff), H = static_cast<double>(m.heads), T = static_cast<double>(a.seq),
               L = static_cast<double>(m.layers), V = static_cast<double>(m.vocab), b = static_cast<double>(a.local_batch);
  auto add = [&](std::string name, double bytes, std::string f) { a.memory.push_back({std::move(name), bytes, std::move(f)}); };
  // FSDP units: embedding, blocks, head; the norms (2d per block, d final) stay replicated.
  const double unit_head = V * d, norm_params = (2 * L + 1) * d;
  double unit_block = 4 * d * d + 3 * d * F, units_blocks = L * unit_block;
  std::string unit_block_f = "block 4d^2 + 3dF";
  if (spec.ep > 1 && m.moe()) {
    // Under ep an MoE block's unit is its attention, its router [E,d] and this rank's E/ep experts
    // (w1, w3 [Fe,d], w2 [d,Fe] each); the largest unit is the prefetched one counted.
    const double E = static_cast<double>(m.moe_experts), Fe = static_cast<double>(m.moe_dff),
                 Lm = static_cast<double>(m.moe_block_count());
    const double unit_moe = 4 * d * d + E * d + 3 * d * Fe * E / spec.ep;
    units_blocks = (L - Lm) * unit_block + Lm * unit_moe;
    unit_block = Lm < L ? std::max(unit_block, unit_moe) : unit_moe;
    unit_block_f = Lm < L ? "largest block (MoE: 4d^2 + E d + 3 d Fe E/ep)" : "MoE block 4d^2 + E d + 3 d Fe E/ep";
  }
  // Tensor parallel: a rank holds 1/tp of every parameter but the replicated norm weights, so the
  // non-FSDP items below count Pr = (P - norms)/tp + norms (= P with tp = 1).
  // Expert parallelism (parallel.ep > 1): the rank's store holds Ph = P - Pe + Pe/ep (its E/ep of
  // every MoE block's experts) and ZeRO/FSDP shard it over ns = dp/ep ranks (expert_dp); without
  // ep Ph = P and ns = dp, so the rows below are a dense model's.
  const HeldParameters held = held_parameters(cfg, world);
  const double Ph = held.held;
  const int ns = held.shard_ranks;
  const std::string n = held.shard_name, hp = held.experts > 0 ? "P - Pe + Pe/ep" : "P";
  const double Pr = (Ph - norm_params) / tp + norm_params;
  // FSDP shards what the rank would hold without it: under tensor parallelism (2D) its slices,
  // Ps = (P - norms)/tp elements, over the dp ranks; gathered units are slices too (1/tp).
  const double Ps = (Ph - norm_params) / tp;
  const std::string ps = "(" + hp + " - norms)" + (tp > 1 ? "/tp" : "");
  // parallel.offload = optimizer (adamw only): the offloaded state leaves the device (below, and
  // a.host_bytes); fsdp also keeps its shard's 16-bit copy for the gathers instead of a cast.
  // optimizer+params: the 16-bit copy is in host memory too; each gather copies its unit's shard
  // up into a send buffer, as the cast of the path without offload (fsdp_gathered).
  const bool offload = cfg.parallel.offload != OffloadMode::none;
  const bool offload_params = cfg.parallel.offload == OffloadMode::optimizer_params;
  if (fsdp && offload) {
    add("parameters", 4 * norm_params, "replicated norms (fp32 master; the shard's master is in host memory)");
    if (offload_params)
      add("parameters_lowp", 0, "0: the shard's 16-bit copy is in host memory (optimizer+params; each gather copies "
                                "its unit's shard up, counted in fsdp_gathered)");
    else
      add("parameters_lowp", e * Ps / ns, "e x " + ps + " / " + n + " (the shard's 16-bit copy the all-gathers send)");
  } else if (fsdp) {
    add("parameters", 4 * Ps / ns + 4 * norm_params, "4 B x " + ps + " / " + n + " (fp32 master shard) + replicated norms");
  }
  if (fsdp) {
    // A gather's send buffer [unit / N]: the cast shard (mixed precision), the shard copied up from
    // the host (optimizer+params, any precision); none under offload = optimizer (the device copy).
    const bool send = offload ? offload_params : mixed;
    add("gradients", 4 * norm_params, "replicated norm gradients (each unit's full-size gradients live only from its "
                                      "backward to its reduce-scatter)");
    add("gradient_shard", 4 * Ps / ns, "4 B x " + ps + " / " + n + " (fp32)");
    if (!fp8_gather) {
      add("fsdp_gathered", e * (unit_head + cfg.parallel.fsdp_prefetch * unit_block * (1 + (send ? 1.0 / ns : 0.0))) / tp +
                               (cfg.parallel.reshard_after_forward ? 0.0 : e * (units_blocks + V * d) / tp),
          std::string(cfg.parallel.reshard_after_forward
                          ? "e x (head unit V d, kept from its forward to its backward + prefetch x " + unit_block_f
                          : "e x (every unit: kept from the forward to the backward) + e x (head + prefetch x " + unit_block_f) +
              (send ? (offload_params ? ", and its shard copied up from the host / " + n + ")" : ", and its cast shard / " + n + ")")
                    : std::string(")")) +
              (tp > 1 ? " / tp" : ""));
    } else {
      // parallel.fsdp_gather_dtype = fp8 (tp = 1): a block unit's gathered weights and its e4m3
      // send buffer are 1 B per element (optimizer+params also keeps the copied-up e B shard until
      // the gather); the head unit stays in the compute dtype.
      const double block_send = (1 + (offload_params ? e : 0.0)) / ns;
      add("fsdp_gathered", e * unit_head + cfg.parallel.fsdp_prefetch * unit_block * (1 + block_send) +
                               (cfg.parallel.reshard_after_forward ? 0.0 : units_blocks + e * V * d),
          std::string(cfg.parallel.reshard_after_forward
                          ? "e x head unit V d + 1 B x prefetch x block 4d^2 + 3dF (e4m3)"
                          : "1 B x every block + e x (embedding + head) (kept from the forward to the backward) + e x "
                            "head + 1 B x prefetch x block (e4m3)") +
              (offload_params ? ", and its e4m3 cast shard and the e B shard copied up from the host / N"
                              : ", and its e4m3 cast shard / N"));
    }
  }
  // The parameters a rank holds: P, or Pr under tensor parallelism.
  const std::string p = tp > 1 && !fsdp ? "Pr" : held.experts > 0 ? "(" + hp + ")" : "P";
  if (!fsdp && offload && mixed) {   // the store keeps fp32 only for the norms (parallel::Spec::master_in_store)
    add("parameters", 4 * norm_params, "replicated norms (fp32; the master of the rest is in host memory)");
    add("parameters_lowp", 2 * Pr, "2 B x " + p + " (bf16/fp16 working copy)");
  } else if (!fsdp) {
    add("parameters", 4 * Pr, "4 B x " + p + " (fp32 master)");
    if (mixed) add("parameters_lowp", 2 * Pr, "2 B x " + p + " (bf16/fp16 working copy)");
  }
  if (fsdp) {
  } else if (spec.grad_storage() == parallel::GradStorage::lazy_buckets)
    add("gradients", 0, "0 at the start of the backward: per-bucket buffers are allocated as the backward frees "
                        "activations (one process, zero2) and freed after the step (zero2: after their reduce-scatter)");
  else
    add("gradients", 4 * Pr, "4 B x " + p + " (one flat fp32 buffer)");
  if (spec.gradient_shard())
    add("gradient_shard", 4 * Pr / ns, "4 B x " + p + " / " + n + " (reduced range)");
  // parallel.grad_exchange = copy-engine (zero2 or bucketed DDP): the receive window's slots (its
  // few KiB of signal flags are left to the memory model).
  const parallel::CopyEngineWindow window = spec.copy_engine_window();
  if (window != parallel::CopyEngineWindow::none)
    add("gradient_exchange_window", 4 * Pr * (ns - 1) / ns,
        "4 B x " + p + " x (" + n + " - 1) / " + n + " (copy-engine receive window: " +
            (window == parallel::CopyEngineWindow::shard_slots ? "one shard-sized slot per other rank)"
                                                               : "each bucket's part of this rank from every other rank)"));
  // parallel.ep_exchange = copy-engine: the ep all-to-all's receive window (its flags: memory model).
  if (spec.ep_exchange_window() && m.moe())
    add("ep_exchange_window",
        static_cast<double>(spec.ep - 1) *
            static_cast<double>(parallel::CopyEngineAllToAll::slot_bytes(m, a.local_batch, static_cast<std::size_t>(e))),
        fmt::format("(ep - 1) x {} rows x d x e (copy-engine receive window: a micro-batch's routed rows per other "
                    "ep rank)", parallel::CopyEngineAllToAll::slot_rows(m, a.local_batch)));
  // fp32 optimizer state: adamw and lamb m, v; sgd and lars one momentum buffer.
  const bool one_state = cfg.optim.name == OptimizerName::sgd || cfg.optim.name == OptimizerName::lars;
  const std::string sb = one_state ? "4 B x " : "8 B x ", what = one_state ? "momentum buffer" : to_string(cfg.optim.name) + " m, v";
  if (fsdp && offload) {
    add("optimizer_state", 8 * norm_params, "8 B x norms (adamw m, v of the replicated norms; the shard's are in host memory)");
    if (offload_params) {
      // Each micro-batch's gathers copy their unit's shard up: the forward's (every unit) and,
      // with reshard_after_forward, the backward's regathers of the L blocks (the head is kept,
      // the embedding's backward reads no weights).
      const double micro = bench ? 1.0 : static_cast<double>(cfg.train.grad_accum);
      const bool regather = cfg.parallel.reshard_after_forward;
      const double gathered = Ps + (regather ? L * unit_block / tp : 0.0);
      // The delayed update keeps two pinned copies: the one the gathers read, the one the host writes.
      const bool delayed = cfg.parallel.offload_delayed_update;
      a.host_bytes = (12 + (delayed ? 2 : 1) * e) * Ps / ns;
      a.host_formula = std::string(delayed ? "(12 + 2e)" : "(12 + e)") + " B x " + ps +
                       " / " + n + " (fp32 master, m, v of the shard and its pinned 16-bit cop" +
                       (delayed ? "ies: the delayed update's two" : "y") + "; parallel/offloaded_shards.h)";
      a.host_transfer_bytes_per_step = 4 * Ps / ns + micro * e * gathered / ns;
      a.host_transfer_formula = "4 B x " + ps + " / " + n + " (fp32 gradient shard down) + e B x " +
                                (micro > 1 ? fmt::format("{:.0f} micro-batches x ", micro) : std::string()) + "(" + ps +
                                (regather ? std::string(" + L blocks") + (tp > 1 ? "/tp" : "") : std::string()) +
                                ") / N (each gather copies its unit's shard up: the forward's" +
                                (regather ? ", the backward's regathers)" : ")");
    } else {
      a.host_bytes = 12 * Ps / ns;
      a.host_formula = "12 B x " + ps + " / " + n + " (fp32 master, m, v of the shard; parallel/offloaded_shards.h)";
      a.host_transfer_bytes_per_step = (4 + e) * Ps / ns;
      a.host_transfer_formula = "(4 + e) B x " + ps + " / " + n + " (fp32 gradient shard down, its 16-bit copy up)";
    }
  } else if (offload) {
    const double owned = Pr / (sharded ? ns : 1);
    const std::string o = sharded ? p + " / " + n : p;
    add("optimizer_state", 0, "0: adamw m, v of " + o + " are in host memory");
    a.host_bytes = 12 * owned;
    a.host_formula = "12 B x " + o + " (fp32 master, m, v of what the rank owns; parallel/offloaded_shards.h)";
    a.host_transfer_bytes_per_step = (4 + e) * owned;
    a.host_transfer_formula = "(4 + e) B x " + o + " (fp32 gradients down, the weights the forward reads up: e per "
                              "matrix and embedding element, 4 per norm weight)";
  } else if (fsdp) {   // the shard's state and the replicated norms'
    add("optimizer_state", (one_state ? 4 : 8) * (Ps / ns + norm_params),
        sb + "(" + ps + " / " + n + " + norms) (" + what + " of this rank's shard and of the norms)");
  } else {
    add("optimizer_state", (one_state ? 4 : 8) * Pr / (sharded ? ns : 1),
        sharded ? sb + p + " / " + n + " (" + what + " of this rank's range)" : sb + p + " (" + what + ")");
  }
  if (held.experts > 0)   // define Pe where the rows first use it
    for (auto& it : a.memory)
      if (it.name == "parameters")
        it.formula += fmt::format("; Pe = {:.4g} parameters of all experts, E/ep = {}/{} of them on this rank{}",
                                  held.experts, m.moe_experts, held.ep,
                                  ns > 1 ? fmt::format(", sharded over dp/ep = {} ranks", ns) : "");
  // Activations kept from the forward to the backward, as the checkpointing policy says
  // (model/recompute.h); every-k adds one recomputed group at the start of the backward.
  // Tensor parallel: q, k, v, o and a, b, g are split (1/tp), x, y1, h, y2 and the norms' rstd
  // replicated, or split too under sequence parallelism (r = 1/tp).
  const double r = sp ? 1.0 / tp : 1.0;
  const double attn = (m.flash ? b * H * T * 4 : b * H * T * T * e) / tp;
  // a, b and g [N,F]; under FP8 g is dropped after the w2 layer's cast (its backward reads the
  // saved g^T; delayed scaling never stores it: model::fp8_swiglu_casts_fused; fp8 has tp = 1).
  const bool g_kept = cfg.precision.mode != PrecisionMode::fp8;
  const double ffn = g_kept ? 3 : 2;
  const double block = (4 * d * r + (4 * d + ffn * F) / tp) * N * e + 2 * N * 4 * r + attn;
  const std::string block_f =
      tp > 1 ? fmt::format("(4d{} + (4d + 3F)/tp) N e + 8N{} + {}/tp", sp ? "/tp" : "", sp ? "/tp" : "",
                           m.flash ? "4 B H T" : "B H T^2 e")
             : fmt::format("(8d + {}F) N e + 8N + {}{}", ffn, m.flash ? "4 B H T (lse)" : "B H T^2 e (probs)",
                           g_kept ? "" : "; no g: the w2 layer keeps its FP8 transpose");
  // An MoE block (docs/moe.md; tp = 1) keeps, instead of a dense block's a, b, g [N,F]: the
  // router's probabilities [N,E] and log-sum-exp [N] (fp32), the chosen experts, gates and slots
  // [N,k] (4 B each), the rows its experts compute xe [Me,d], their a|b [2,Me,Fe] and g [Me,Fe],
  // and this rank's tokens' expert outputs ye [M,d]; under ep also the permutation [Me] (4 B).
  // Assumed: routing balanced over the experts, so M = Me = the kept assignments of N tokens,
  // N k (dropless) or at most E x capacity per sequence.
  const double Lm = static_cast<double>(m.moe_block_count());
  double block_moe = block;
  std::string block_moe_f;
  if (Lm > 0) {
    const double E = static_cast<double>(m.moe_experts), k = static_cast<double>(m.moe_top_k),
                 Fe = static_cast<double>(m.moe_dff);
    const double M = std::min(N * k, E * static_cast<double>(m.expert_capacity(a.seq)) * b);
    const bool ep = spec.ep > 1;
    block_moe = (8 * d * N + (3 * Fe + 2 * d) * M) * e + 2 * N * 4 + attn + N * (E + 1) * 4 + N * k * 12 +
                (ep ? M * 4 : 0.0);
    block_moe_f = fmt::format("MoE block: (8d N + (3Fe + 2d) M) e + 8N + {} + 4 N (E + 1) + 12 N k{}, M = {:.4g} rows",
                              m.flash ? "4 B H T" : "B H T^2 e", ep ? " + 4 M" : "", M);
  }
  // MoE blocks among blocks [from, L).
  auto moe_blocks_from = [&](double from) {
    double n = 0;
    for (std::int64_t l = static_cast<std::int64_t>(from); l < m.layers; ++l) n += m.is_moe_block(l) ? 1 : 0;
    return n;
  };
  const double block_max = std::max(block, block_moe);
  const std::string moe_note = Lm > 0 ? "; " + block_moe_f : "";
  const Checkpointing ac = cfg.train.activation_checkpointing;
  if (ac == Checkpointing::every_k) {
    // c checkpointed blocks (train.checkpoint_layers) keep their groups' inputs, and under
    // keep_attention each its attention output and aux; the other L - c keep everything.
    const double c = model::RecomputePolicy::from(cfg.train).checkpointed_end(0, static_cast<int>(m.layers));
    const double k = std::min<double>(static_cast<double>(cfg.train.checkpoint_k), c);
    const bool keep_attn = cfg.train.checkpoint_keep_attention;
    const double kept = keep_attn ? N * d * e / tp + attn : 0.0;
    const double tail_moe = moe_blocks_from(c);
    add("activations",
        std::ceil(c / k) * N * d * e + c * kept + (L - c - tail_moe) * block + tail_moe * block_moe +
            k * (block_max - kept),
        fmt::format("ceil(c/k) N d e (group inputs){} + (L - c) x ({}) (blocks not checkpointed) + k x ({}{}) (one "
                    "group recomputed), c = {}, k = {}{}",
                    keep_attn ? fmt::format(" + c x (N d e{} + {}) (attention outputs and {} kept)", tp > 1 ? "/tp" : "",
                                            m.flash ? "4 B H T" : "B H T^2 e", m.flash ? "lse" : "probabilities")
                              : "",
                    block_f, keep_attn ? "the rest of " : "", block_f, c, k, moe_note));
  } else if (ac == Checkpointing::selective || ac == Checkpointing::selective_mlp) {
    const double f = ac == Checkpointing::selective ? 2 : 0;   // [N,F] tensors kept per block (a, b)
    const double kept = (6 * d + f * F) * N * e + 2 * N * 4 + (m.flash ? attn : 0.0);
    add("activations", L * kept + (block - kept),
        fmt::format("L x ((6d{}) N e + 8N{}) + one block's recomputed part", f > 0 ? " + 2F" : "",
                    m.flash ? " + 4 B H T" : ""));
  } else {
    add("activations", (L - Lm) * block + Lm * block_moe,
        Lm > 0 ? fmt::format("(L - Lm) x ({}) + Lm x (MoE block), Lm = {}{}", block_f, Lm, moe_note)
               : "L x (" + block_f + ")");
  }
  if (cfg.precision.mode == PrecisionMode::fp8) {
    // The FP8 layers (model/transformer_fp8.cpp; model::kFp8BlockGemms): per block the saved x^T
    // of its 4 layers q|k|v, o, w1|w3, w2 and w^T of each (1 B per element) with their [4] fp32
    // scales; a checkpointed block keeps the scales only (one group recomputed), selective-mlp
    // drops the w1|w3 layer's operands; the scaling state of every operand (x, w, dy of each
    // layer: scale, inverse and an amax history of H, 1 for current).
    // Where the optimizer step casts the weights (parallel::step_casts_fp8_weights), every block's
    // codes and their transposes are kept from step to step (2 B per weight element) and no
    // forward keeps a w^T of its own.
    const bool codes = parallel::step_casts_fp8_weights(cfg, spec, bench ? 1 : cfg.train.grad_accum,
                                                        device_name.empty() ? Device::cpu : Device::cuda);
    const double G8 = model::kFp8GemmsPerBlock;
    const double wt = codes ? 0 : 4 * d * d + 3 * d * F, w13t = codes ? 0 : 2 * d * F;
    const double ops8 = (3 * d + F) * N + wt, scales = G8 * 16.0;
    const double H8 = cfg.precision.fp8_scaling == Fp8Scaling::delayed ? static_cast<double>(cfg.precision.fp8_history) : 1;
    const double state = L * G8 * 3 * 4 * (2 + H8) + (codes ? L * 2 * (4 * d * d + 3 * d * F) : 0);
    const std::string wt_f = codes ? "" : " + 4d^2 + 3dF";
    double kept8 = L * (ops8 + scales);
    std::string f8 = "L x ((3d + F) N" + wt_f + " + 64)";
    if (ac == Checkpointing::every_k) {
      const double c = model::RecomputePolicy::from(cfg.train).checkpointed_end(0, static_cast<int>(m.layers));
      const double k = std::min<double>(static_cast<double>(cfg.train.checkpoint_k), c);
      kept8 = (L - c + k) * ops8 + L * scales;
      f8 = fmt::format("(L - c + k) x ((3d + F) N{}) + L x 64, c = {}, k = {}", wt_f, c, k);
    } else if (ac == Checkpointing::selective_mlp) {
      kept8 = L * (ops8 - N * d - w13t + scales) + N * d + w13t;
      f8 = std::string("L x ((2d + F) N") + (codes ? "" : " + 4d^2 + dF") + " + 64) + one block's w1|w3 operands";
    }
    add("fp8_operands", kept8 + state,
        f8 + fmt::format(" + {} x 12 x 4 B x (2 + H) (scaling state, H = {})", L, H8) +
            (codes ? " + L x 2 (4d^2 + 3dF) (the weights' codes and transposes the step casts)" : ""));
  }
  // The fused LM head + cross-entropy (model/transformer_head.cpp): one row chunk of logits
  // (model.ce_chunk_rows), then its gradient in place; the final norm's output [Nl,d] and the
  // head's input gradient [N,d] while the head unit runs (its backward is in the forward).
  const double chunk = static_cast<double>(
      m.head_chunk_rows(static_cast<std::int64_t>(N), m.vocab / tp, static_cast<std::int64_t>(e)));
  add("logits", chunk * V / tp * e + N * d * e * r + N * d * e,
      fmt::format("rows x V{} e (one chunk of {} rows of logits, then their gradient in place) + final norm output "
                  "and its gradient",
                  tp > 1 ? "/tp" : "", chunk));
  for (const auto& it : a.memory) a.peak_bytes += it.bytes;
  // Bytes each rank sends per step (ring algorithms): all-reduce 2(N-1)/N x G, reduce-scatter
  // and all-gather (N-1)/N x G each; zero1-broadcast: all-reduce + the owner's broadcasts.
  // Under ep the data-parallel strategy runs over expert_dp (ns = dp/ep ranks, on Ph); the ep term
  // is added below.
  const double G = 4 * Pr, f = ns > 1 ? static_cast<double>(ns - 1) / ns : 0.0;
  if (ns <= 1) {
    a.comm_formula = "none (one data-parallel rank)";
  } else if (!sharded) {
    a.comm_bytes_per_step = 2 * f * G;
    a.comm_formula = "all-reduce of fp32 gradients: 2 (N-1)/N x 4P";
  } else if (fsdp) {
    const double reshard = cfg.parallel.reshard_after_forward ? 2.0 : 1.0;
    // Over the dp group of each tp rank: its slices (Ps); the norms' all-reduce in full.
    a.comm_bytes_per_step = f * (reshard * e * Ps + 4 * Ps) + 2 * f * 4 * norm_params;
    const std::string gathered = tp > 1 ? "Ps (Ps = (P - norms)/tp, this tp rank's slices)" : "P";
    a.comm_formula = cfg.parallel.reshard_after_forward
                         ? "all-gather (N-1)/N x e " + gathered + " twice (forward, backward) + reduce-scatter (N-1)/N x 4" +
                               (tp > 1 ? "Ps" : "P")
                         : "all-gather (N-1)/N x e " + gathered + " once + reduce-scatter (N-1)/N x 4" + (tp > 1 ? "Ps" : "P");
    if (fp8_gather) {
      // The blocks (L x block) travel in e4m3: the forward's gathers, and the backward's regathers
      // under reshard_after_forward (the head is kept, the embedding's backward reads no weights),
      // and before each gather of a block one all-reduce of its 7 fp32 amaxes, 2 (N-1)/N x 28 B.
      const double blocks = L * unit_block, amax_bytes = 2 * f * 4 * 7 * L;
      a.comm_bytes_per_step = f * (e * (Ps - blocks) + reshard * blocks + 4 * Ps) + reshard * amax_bytes +
                              2 * f * 4 * norm_params;
      a.comm_formula = std::string("all-gather (N-1)/N x (e x (embedding + head) + 1 B x L blocks (e4m3)") +
                       (cfg.parallel.reshard_after_forward ? ", the blocks twice (forward, backward))" : ")") +
                       " + the blocks' amax all-reduces 2 (N-1)/N x 28 B per gather + reduce-scatter (N-1)/N x 4P";
    }
  } else if (spec.broadcast_update()) {
    a.comm_bytes_per_step = 2 * f * G + G / dp;
    a.comm_formula = "all-reduce 2 (N-1)/N x 4P + broadcast of the own range 4P/N";
  } else {
    // zero1/zero2 gather the working copy (e = 2 in bf16/fp16, the master itself in fp32) and, in
    // mixed precision, the fp32 norm weights the forward reads from the master.
    a.comm_bytes_per_step = f * G + f * e * Pr + (mixed ? f * 4 * norm_params : 0.0);
    a.comm_formula = mixed ? "reduce-scatter (N-1)/N x 4P + all-gather of the working copy (N-1)/N x 2P and of the "
                             "fp32 norm weights (N-1)/N x 4 (2L+1) d"
                           : "reduce-scatter (N-1)/N x 4P + all-gather (N-1)/N x 4P";
  }
  if (held.experts > 0) {
    // The dense gradients are first summed over the ep group: an all-reduce of P - Pe fp32
    // elements per step (fsdp: per micro-batch, as each unit's reduce-scatter follows its backward).
    const double micro = fsdp && !bench ? static_cast<double>(std::max<std::int64_t>(1, cfg.train.grad_accum)) : 1.0;
    const double fe = static_cast<double>(held.ep - 1) / held.ep;
    a.comm_bytes_per_step += micro * 2 * fe * 4 * (P - held.experts);
    a.comm_formula = (ns <= 1 ? std::string() : "over dp/ep: " + a.comm_formula + ", on P - Pe + Pe/ep; ") +
                     fmt::format("dense all-reduce over ep: {}2 (ep-1)/ep x 4 (P - Pe)", micro > 1 ? fmt::format("{:.0f} micro-batches x ", micro) : "");
  }
  a.flops_per_step = m.train_flops_per_token(m.context) * static_cast<double>(B * m.context);
  a.flops_per_step_causal = m.train_flops_per_token_causal(m.context) * static_cast<double>(B * m.context);
  a.peak_flops = device_peak_flops(device_name.empty() ? "NVIDIA H100 80GB HBM3" : device_name, cfg.precision.mode,
                                   cfg.precision.tf32);
  a.ideal_step_s = a.peak_flops > 0 ? a.flops_per_step / (dp * tp * a.peak_flops) : 0;
  const auto tpc = tensor_parallel_comm(m, static_cast<double>(B / dp * m.context), tp, sp, e,
                                        cfg.train.activation_checkpointing == Checkpointing::every_k);
  a.tp_comm_bytes_per_step = tpc.bytes;
  a.tp_comm_formula = tpc.formula;
  analysis(a);
  return a;
}

namespace {

// The deck as the run the accounting describes (a train step of train.batch_size on dp x tp x pp
// ranks, checked as bench-model so that no training data need exist): the first check that run
// would fail (exit 2), or empty when it would start. The accounting job itself skips the checks of
// jobs that run the model, so without this it would predict decks the run refuses.
std::string run_refusal(const Config& cfg, int world) {
  Config run = cfg;
  run.run.job = JobKind::bench_model;
  run.bench.mode = BenchMode::train_step;
  run.bench.batch_size = cfg.train.batch_size;
  // The devices are the run's, not this process's (accounting runs on a CPU for a GPU deck).
  run.parallel.device = DeviceChoice::automatic;
  run.parallel.backend = BackendChoice::automatic;
  const comm::MeshShape mesh = parallel::Spec::resolve(cfg.parallel, world).mesh_shape();
  try {
    io::validate(run, mesh.dp * mesh.tp * mesh.pp);
  } catch (const UsageError& e) {
    return e.what();
  }
  return {};
}

// cost.tokens > 0: GPU-hours and money of training on that many tokens (cost_estimate.h), as a
// table /accounting/cost (one row per part of the wall time) and attributes.
void write_cost(JobEnv& env, const Accounting& a, int world) {
  const Config& cfg = env.cfg;
  const CostInputs in = cost_inputs(cfg, world, a.analysis_flops);
  const CostEstimate e = estimate_cost(in);
  auto table = env.out.create_table("/accounting/cost", {{"item", io::Column::Type::str, ""},
                                                         {"hours", io::Column::Type::f64, "h"},
                                                         {"gpu_hours", io::Column::Type::f64, "h"},
                                                         {"cost", io::Column::Type::f64, "currency"},
                                                         {"formula", io::Column::Type::str, ""}});
  struct Row {
    const char* item;
    double hours;
    std::string formula;
  };
  const std::vector<Row> rows{
      {"compute", e.compute_h, "D x FLOPs/token / (gpus x peak x MFU)"},
      {"checkpoints", e.checkpoint_h, "ceil(compute / interval) x 12 B P / bandwidth"},
      {"rework", e.rework_h, "rate x gpus x (compute + checkpoints) x (interval/2 + restart)"},
      {"total", e.wall_h, "compute + checkpoints + rework"},
  };
  for (const auto& r : rows)
    table.append({std::string(r.item), r.hours, r.hours * in.gpus, r.hours * in.gpus * e.price_per_gpu_hour, r.formula});
  const std::string g = "/accounting/cost";
  env.out.set_attr(g, "tokens", in.tokens);
  env.out.set_attr(g, "flops_per_token", in.flops_per_token);
  env.out.set_attr(g, "flops", e.flops);
  env.out.set_attr(g, "gpus", in.gpus);
  env.out.set_attr(g, "peak_flops_per_gpu", in.peak_flops);
  env.out.set_attr(g, "mfu", in.mfu);
  env.out.set_attr(g, "mfu_source", cfg.cost.mfu > 0 ? std::string("cost.mfu") : cfg.cost.mfu_from);
  env.out.set_attr(g, "checkpoint_bytes", in.state_bytes);
  env.out.set_attr(g, "checkpoints", e.checkpoints);
  env.out.set_attr(g, "checkpoint_write_s", e.checkpoint_write_s);
  env.out.set_attr(g, "preemptions", e.preemptions);
  env.out.set_attr(g, "lost_per_preemption_h", e.lost_per_preemption_h);
  env.out.set_attr(g, "wall_h", e.wall_h);
  env.out.set_attr(g, "gpu_hours", e.gpu_hours);
  env.out.set_attr(g, "price_per_gpu_hour", e.price_per_gpu_hour);
  env.out.set_attr(g, "cost", e.cost);
  if (!env.is_root()) return;
  fmt::print("cost of {:.4g} tokens: {:.4g} FLOPs ({:.4g} per token) on {} GPUs at {:.1f} TFLOP/s x MFU {:.3f}\n",
             in.tokens, e.flops, in.flops_per_token, in.gpus, in.peak_flops / 1e12, in.mfu);
  fmt::print("{:<12} {:>12} {:>12} {:>12}  {}\n", "part", "hours", "GPU-hours", "cost", "counted as");
  for (const auto& r : rows)
    fmt::print("{:<12} {:>12.3f} {:>12.1f} {:>12.2f}  {}\n", r.item, r.hours, r.hours * in.gpus,
               r.hours * in.gpus * e.price_per_gpu_hour, r.formula);
  fmt::print("({} checkpoints of {:.3g} GB, {:.1f} s each; {:.3f} preemptions expected, {:.2f} h lost each; price "
             "{:.4g} per GPU-hour after a {:.0f}% spot discount)\n",
             e.checkpoints, in.state_bytes / 1e9, e.checkpoint_write_s, e.preemptions, e.lost_per_preemption_h,
             e.price_per_gpu_hour, 100 * in.spot_discount);
}

}  // namespace

int run_accounting(JobEnv& env) {
  const Config& cfg = env.cfg;
  // The planned run's ranks and device, not this process's (accounting.world, accounting.device).
  const int world = io::planned_world(cfg, env.world);
  const PlannedDevice target = planned_device(cfg, env.rt);
  const Accounting a = account(cfg, world, target.cuda ? target.name : "");
  auto table = env.out.create_table("/accounting/memory", {{"component", io::Column::Type::str, ""},
                                                           {"bytes", io::Column::Type::f64, "bytes"},
                                                           {"formula", io::Column::Type::str, ""}});
  for (const auto& it : a.memory) table.append({it.name, it.bytes, it.formula});
  const std::string g = "/accounting";
  env.out.set_attr(g, "parameters", a.parameters);
  env.out.set_attr(g, "local_batch", a.local_batch);
  env.out.set_attr(g, "peak_bytes_per_rank", a.peak_bytes);
  env.out.set_attr(g, "comm_bytes_per_step_per_rank", a.comm_bytes_per_step);
  env.out.set_attr(g, "comm_formula", a.comm_formula);
  env.out.set_attr(g, "flops_per_step", a.flops_per_step);
  env.out.set_attr(g, "flops_per_step_causal", a.flops_per_step_causal);
  env.out.set_attr(g, "peak_flops_per_device", a.peak_flops);
  env.out.set_attr(g, "ideal_step_s", a.ideal_step_s);
  env.out.set_attr(g, "tp_comm_bytes_per_step_per_rank", a.tp_comm_bytes_per_step);
  env.out.set_attr(g, "tp_comm_formula", a.tp_comm_formula);
  env.out.set_attr(g, "analysis_flops_per_device", a.analysis_flops);
  env.out.set_attr(g, "analysis_link_bytes_per_s", a.analysis_link_bytes);
  env.out.set_attr(g, "host_bytes_per_rank", a.host_bytes);
  env.out.set_attr(g, "host_formula", a.host_formula);
  env.out.set_attr(g, "host_transfer_bytes_per_step_per_rank", a.host_transfer_bytes_per_step);
  env.out.set_attr(g, "host_transfer_formula", a.host_transfer_formula);
  auto bounds = env.out.create_table("/accounting/comm_bound_degree", {{"strategy", io::Column::Type::str, ""},
                                                                       {"degree", io::Column::Type::i64, ""},
                                                                       {"limit", io::Column::Type::i64, ""},
                                                                       {"split", io::Column::Type::str, ""},
                                                                       {"formula", io::Column::Type::str, ""}});
  for (const auto& b : a.bounds) bounds.append({b.strategy, b.degree, b.limit, b.split, b.formula});
  // MoE models: their terms (/accounting/moe) besides the replayed phases below, which model the
  // MoE blocks too (memory_replay_moe.cpp).
  if (cfg.model.moe_experts > 0) write_moe_accounting(env, account_moe(cfg, world));
  // Per-phase peaks of the mode the deck runs (memory_model.h), as the CPU allocator counts them
  // and as a CUDA run's tracker would (plus cuBLASLt's workspace and flash attention's). Under
  // pipelines each stage's (its dp 0, tp 0 rank; memory_model_pipeline.cpp), and the first table
  // holds the stage whose CUDA peak is the largest, both columns of that one stage.
  const std::vector<MemoryPhases> cpu_stages = predict_stage_phases(cfg, world, false);
  const std::vector<MemoryPhases> cuda_stages = predict_stage_phases(cfg, world, true);
  const bool pipelined = cuda_stages.size() > 1;
  std::size_t largest = 0;
  for (std::size_t st = 1; st < cuda_stages.size(); ++st)
    if (cuda_stages[st].peak > cuda_stages[largest].peak) largest = st;
  const MemoryPhases& on_cpu = cpu_stages[largest];
  const MemoryPhases& on_cuda = cuda_stages[largest];
  auto phases = env.out.create_table("/accounting/memory_phases", {{"phase", io::Column::Type::str, ""},
                                                                   {"cpu_bytes", io::Column::Type::f64, "bytes"},
                                                                   {"cuda_bytes", io::Column::Type::f64, "bytes"}});
  for (std::size_t i = 0; i < on_cpu.phases.size(); ++i)
    phases.append({on_cpu.phases[i].phase, on_cpu.phases[i].bytes, on_cuda.phases[i].bytes});
  if (pipelined) {
    env.out.set_attr(g, "memory_phases_stage", static_cast<std::int64_t>(largest));
    auto t = env.out.create_table("/accounting/memory_phases_stages", {{"stage", io::Column::Type::i64, ""},
                                                                       {"phase", io::Column::Type::str, ""},
                                                                       {"cpu_bytes", io::Column::Type::f64, "bytes"},
                                                                       {"cuda_bytes", io::Column::Type::f64, "bytes"}});
    for (std::size_t st = 0; st < cuda_stages.size(); ++st) {
      const auto &c = cpu_stages[st], &u = cuda_stages[st];
      for (std::size_t i = 0; i < c.phases.size(); ++i)
        t.append({static_cast<std::int64_t>(st), c.phases[i].phase, c.phases[i].bytes, u.phases[i].bytes});
    }
  }
  env.out.set_attr(g, "mode", to_string(job_mode(cfg)));
  const std::string refused = run_refusal(cfg, world);
  env.out.set_attr(g, "run_refused", refused);
  env.out.set_attr(g, "predicted_peak_bytes_cpu", on_cpu.peak);
  env.out.set_attr(g, "predicted_peak_bytes_cuda", on_cuda.peak);
  env.out.set_attr(g, "memory_model_layout", on_cpu.layout);
  env.out.set_attr(g, "world", static_cast<std::int64_t>(world));
  env.out.set_attr(g, "device", target.name);
  env.out.set_attr(g, "device_source", target.source);
  env.out.set_attr(g, "device_memory_bytes", target.memory_bytes);
  // The peak that applies on the planned device, and whether it fits there.
  const double peak_on_target = target.cuda ? on_cuda.peak : on_cpu.peak;
  if (env.is_root()) {
    fmt::print("accounting: {} parameters ({:.2f} B), {} ranks planned on {}, local batch {} x {} tokens, {}\n",
               a.parameters, static_cast<double>(a.parameters) / 1e9, world, target.name, a.local_batch, a.seq,
               cfg.precision.mode);
    fmt::print("{:<18} {:>12}  {}\n", "memory per rank", "GiB", "counted as");
    for (const auto& it : a.memory) fmt::print("{:<18} {:>12.3f}  {}\n", it.name, it.bytes / (1u << 30), it.formula);
    fmt::print("{:<18} {:>12.3f}\n", "total", a.peak_bytes / (1u << 30));
    fmt::print("memory per phase of {} ({}):\n{:<18} {:>12} {:>12}\n", job_mode(cfg), on_cpu.layout, "phase", "CPU GiB",
               "CUDA GiB");
    for (std::size_t i = 0; i < on_cpu.phases.size(); ++i)
      fmt::print("{:<18} {:>12.3f} {:>12.3f}\n", on_cpu.phases[i].phase, on_cpu.phases[i].bytes / (1u << 30),
                 on_cuda.phases[i].bytes / (1u << 30));
    fmt::print("{:<18} {:>12.3f} {:>12.3f}\n", "peak", on_cpu.peak / (1u << 30), on_cuda.peak / (1u << 30));
    if (target.memory_bytes > 0)
      fmt::print("on {} ({:.2f} GiB; {}): the peak of {:.2f} GiB per rank {} ({:.0f}% of the device)\n", target.name,
                 target.memory_bytes / (1u << 30), target.source, peak_on_target / (1u << 30),
                 peak_on_target <= target.memory_bytes ? "fits" : "does NOT fit",
                 100 * peak_on_target / target.memory_bytes);
    if (pipelined) {
      fmt::print("peak per pipeline stage (replayed under {}):\n{:<18} {:>12} {:>12}\n", cfg.parallel.schedule, "stage",
                 "CPU GiB", "CUDA GiB");
      for (std::size_t st = 0; st < cuda_stages.size(); ++st)
        fmt::print("{:<18} {:>12.3f} {:>12.3f}\n", st, cpu_stages[st].peak / (1u << 30), cuda_stages[st].peak / (1u << 30));
    }
    fmt::print("communication per step per rank: {:.3f} GiB ({})\n", a.comm_bytes_per_step / (1u << 30), a.comm_formula);
    if (a.host_bytes > 0)
      fmt::print("offload ({}): host memory {:.3f} GiB per rank ({}); {:.3f} GiB per step per rank between host and "
                 "device ({})\n",
                 cfg.parallel.offload, a.host_bytes / (1u << 30), a.host_formula,
                 a.host_transfer_bytes_per_step / (1u << 30), a.host_transfer_formula);
    fmt::print("FLOPs per step: {:.4g}; at the device peak ({:.0f} TFLOP/s) a step takes at least {:.1f} ms "
               "({:.1f} ms at 50% MFU)\n",
               a.flops_per_step, a.peak_flops / 1e12, a.ideal_step_s * 1e3, 2 * a.ideal_step_s * 1e3);
    fmt::print("FLOPs per step with causal attention halved: {:.4g}\n", a.flops_per_step_causal);
    if (cfg.parallel.tp > 1)
      fmt::print("tensor parallel (tp {}{}): {:.3f} GiB per step per rank ({})\n", cfg.parallel.tp,
                 cfg.parallel.sequence_parallel ? ", sequence parallel" : "", a.tp_comm_bytes_per_step / (1u << 30),
                 a.tp_comm_formula);
    fmt::print("communication bound from degree (C = {:.1f} TFLOP/s, W = {:.0f} GB/s per GPU; CS336 §8):\n",
               a.analysis_flops / 1e12, a.analysis_link_bytes / 1e9);
    for (const auto& b : a.bounds)
      fmt::print("  {:<20} {:>8}  {}{}\n", b.strategy,
                 b.degree > 0 ? std::to_string(b.degree) : fmt::format("> {}", b.limit), b.formula,
                 b.split.empty() ? "" : " (at that degree: " + b.split + ")");
    if (!refused.empty())
      fmt::print("note: these are predictions for a run lmscale refuses to start (exit 2): {}\n", refused);
  }
  if (cfg.cost.tokens > 0) write_cost(env, a, world);
  return 0;
}

}  // namespace lmscale::jobs
