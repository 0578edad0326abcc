// Per-phase memory prediction (include/lmscale/jobs/predict/memory_model.h) of one rank: the long-lived
// state of its layout, plus the replay (memory_replay.h) of one step's allocations. Pipeline
// stages: memory_model_pipeline.cpp.
#include "lmscale/jobs/predict/memory_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "lmscale/comm/communicator.h"
#include "lmscale/comm/peer_copy.h"
#include "lmscale/core/error.h"
#include "lmscale/model/model_dims.h"
#include "lmscale/parallel/copy_engine_all_reduce.h"
#include "lmscale/parallel/copy_engine_all_to_all.h"
#include "lmscale/parallel/spec.h"
#include "lmscale/parallel/strategy.h"
#include "lmscale/parallel/zero.h"
#include "memory_replay.h"

namespace lmscale::jobs {

using replay::Grads;
using replay::Shapes;
using replay::Sim;

BenchMode job_mode(const Config& cfg) { return cfg.run.job == JobKind::bench_model ? cfg.bench.mode : BenchMode::train_step; }

std::vector<MemoryPhases> predict_stage_phases(const Config& cfg, int world, bool cuda) {
  const comm::MeshShape mesh = parallel::Spec::resolve(cfg.parallel, world).mesh_shape();
  std::vector<MemoryPhases> stages;
  for (int stage = 0; stage < mesh.pp; ++stage)
    stages.push_back(predict_memory_phases(cfg, world, cuda, comm::mesh_rank(mesh, stage, 0, 0)));
  return stages;
}

namespace {

// Each phase is affine in the depth L once the blocks' pattern repeats and the fixed-size parts
// (the first gradient bucket, capped at its size; the LM head's chunks) no longer grow: each
// block then adds the same kept activations, gradients and state, up to where fixed-size
// gradient buckets fall. Replays at depths D < 2D < 4D with L's residue modulo the pattern's
// period (pipeline chunks pp x virtual_stages, every-k groups of checkpoint_k) give two slopes
// per phase; when they agree within kSlopeAgreement the line through 2D and 4D is evaluated at L,
// else D doubles (a regime still changing: buckets not yet full). nullopt where the pattern is
// not periodic (explicit parallel.stage_layers), where the depths would not reach past
// train.checkpoint_layers, or where no slope settles before 4D reaches L (then L is replayed).
constexpr double kSlopeAgreement = 5e-3;

std::optional<MemoryPhases> extrapolated_memory_phases(const Config& cfg, int world, bool cuda, int rank) {
  const std::int64_t L = cfg.model.num_layers;
  if (L <= kMaxReplayedLayers || !cfg.parallel.stage_layers.empty()) return std::nullopt;
  const auto& t = cfg.train;
  const std::int64_t chunks = cfg.parallel.pp * std::max<std::int64_t>(1, cfg.parallel.virtual_stages);
  const std::int64_t k = t.activation_checkpointing == Checkpointing::every_k ? std::max<std::int64_t>(1, t.checkpoint_k) : 1;
  // MoE models repeat every moe_every blocks too.
  const std::int64_t moe_every = cfg.model.moe_experts > 0 ? std::max<std::int64_t>(1, cfg.model.moe_every) : 1;
  const std::int64_t period = std::lcm(chunks * k, moe_every);
  const std::int64_t residue = L % period;
  auto replay_at = [&](std::int64_t m) {
    Config c = cfg;
    c.model.num_layers = residue + m * period;
    return replay_memory_phases(c, world, cuda, rank);
  };
  // The shallowest replay's chunks must hold more than the checkpointed blocks and a group, and
  // gradients of at least the largest bucket (at 2 bytes an element), so that the first bucket
  // is full: below that it grows with the depth (a slope that changes later, which two nearby
  // slopes would not show).
  const auto& d = cfg.model;
  const double block_elems = (4.0 * static_cast<double>(d.d_model * d.d_model) + 3.0 * static_cast<double>(d.d_model * d.d_ff)) /
                             static_cast<double>(cfg.parallel.tp);
  const double bucket = std::max(static_cast<double>(parallel::Spec::resolve(cfg.parallel, world).lazy_bucket_bytes()),
                                 cfg.parallel.bucket_mb * 1024 * 1024);
  const auto min_chunk = static_cast<std::int64_t>(std::ceil(bucket / (2.0 * std::max(1.0, block_elems)))) +
                         t.checkpoint_layers + k;
  std::int64_t m = std::max<std::int64_t>(1, (kMaxReplayedLayers / 2) / period);
  while ((residue + m * period) / chunks < min_chunk) m *= 2;
  MemoryPhases a = replay_at(m), b = replay_at(2 * m);
  for (; residue + 4 * m * period < L; m *= 2) {
    const MemoryPhases c = replay_at(4 * m);
    bool settled = c.phases.size() == b.phases.size() && b.phases.size() == a.phases.size();
    for (std::size_t i = 0; settled && i < c.phases.size(); ++i) {
      const double first = b.phases[i].bytes - a.phases[i].bytes, second = (c.phases[i].bytes - b.phases[i].bytes) / 2;
      settled = std::abs(second - first) <= kSlopeAgreement * std::max(std::abs(first), std::abs(second));
    }
    if (settled) {
      const std::int64_t L1 = residue + 2 * m * period, L2 = residue + 4 * m * period;
      const double x = static_cast<double>(L - L2) / static_cast<double>(L2 - L1);
      MemoryPhases out;
      for (std::size_t i = 0; i < c.phases.size(); ++i) {
        const double bytes = c.phases[i].bytes + (c.phases[i].bytes - b.phases[i].bytes) * x;
        out.phases.push_back({c.phases[i].phase, bytes});
        out.peak = std::max(out.peak, bytes);
      }
      out.layout = fmt::format("{}; {} blocks extrapolated from replays of {} and {}", c.layout, L, L1, L2);
      return out;
    }
    a = std::move(b);
    b = c;
  }
  return std::nullopt;
}

}  // namespace

MemoryPhases predict_memory_phases(const Config& cfg, int world, bool cuda, int rank) {
  if (rank < 0) {   // the rank that needs the most: the stage with the largest peak
    auto stages = predict_stage_phases(cfg, world, cuda);
    return *std::max_element(stages.begin(), stages.end(),
                             [](const MemoryPhases& a, const MemoryPhases& b) { return a.peak < b.peak; });
  }
  if (auto extrapolated = extrapolated_memory_phases(cfg, world, cuda, rank)) return *extrapolated;
  return replay_memory_phases(cfg, world, cuda, rank);
}

MemoryPhases replay_memory_phases(const Config& cfg, int world, bool cuda, int rank) {
  const parallel::Spec spec = parallel::Spec::resolve(cfg.parallel, world);
  const comm::MeshShape mesh = spec.mesh_shape();
  if (mesh.pp > 1) return predict_pipeline_phases(cfg, world, cuda, rank);
  const int tp = mesh.tp, dp = mesh.dp;
  // The index ZeRO shards by: in the dp group, or in the expert_dp group under expert parallelism.
  const int dp_rank = spec.ep > 1 ? comm::mesh_coords(mesh, rank).expert_dp : comm::mesh_coords(mesh, rank).dp;
  MemoryPhases out;
  const bool bench = cfg.run.job == JobKind::bench_model;
  const BenchMode mode = job_mode(cfg);
  const bool fsdp = spec.fsdp(), sharded = spec.sharded_optimizer();
  const std::int64_t accum = bench ? 1 : std::max<std::int64_t>(1, cfg.train.grad_accum);
  const std::int64_t global = bench ? cfg.bench.batch_size : cfg.train.batch_size;
  const double workspace = cuda ? 32.0 * 1024 * 1024 : 0.0;   // cuBLASLt's, allocated with the runtime
  // The MoE experts' second GEMM stream has a workspace of its own (ops/cuda/gemm_lanes.h), made
  // by the first expert products: in every phase after init. (The wgmma form's fallback loop runs
  // on one stream: no second workspace.)
  const double lanes_workspace =
      cuda && cfg.model.moe_experts > 0 && cfg.model.moe_expert_gemm == MoeExpertGemm::loop ? workspace : 0.0;

  Shapes s = replay::shapes_for(cfg, static_cast<double>(global / dp / accum), cuda);
  s.fp8_step_casts = parallel::step_casts_fp8_weights(cfg, spec, accum, cuda ? Device::cuda : Device::cpu);
  const auto sizes = replay::param_sizes(s);
  double P = 0;
  for (double n : sizes) P += n;

  // Long-lived state after init, per layout.
  double init = 0, grads_after = 0;   // grads_after: gradient bytes alive when the backward ends
  Grads gr;
  if (fsdp) {
    // Sharded over the gradient group: dp, or expert_dp = dp / ep under expert parallelism, where
    // the sizes above are this ep rank's store (its experts) and the dense sum over ep is in place.
    init = replay::setup_fsdp(gr, cfg, s, spec.gradient_group(), {});
    // Under tensor parallelism (2D) the sizes above are this tp rank's slices (local shapes), so
    // the units, shards and gathers are those of the slices.
    out.layout = std::string("fsdp (master, gradient shard and optimizer state of 1/") +
                 (spec.ep > 1 ? fmt::format("(dp/ep) = 1/{} of this ep rank's store", spec.gradient_group()) : "1/dp") +
                 (tp > 1 ? " of this tp rank's slices" : "") + "; gathered units beside the replayed activations)";
  } else {
    const bool lazy = spec.grad_storage() == parallel::GradStorage::lazy_buckets;
    init = replay::store_bytes(cfg, spec, s, P, dp_rank, cuda);
    gr.lazy = lazy;
    gr.init(sizes, replay::param_joins(s), spec.lazy_bucket_bytes());
    // parallel.grad_exchange = copy-engine: the receive window and its signal flags (one per
    // bucket and rank; two for bucketed DDP), from initialisation on (comm/peer_copy.h). zero2:
    // one slot of the largest shard per other rank; bucketed DDP: per other rank, this rank's
    // part of every bucket (parallel/copy_engine_all_reduce.h).
    switch (spec.copy_engine_window()) {
      case parallel::CopyEngineWindow::shard_slots: {
        const auto counts = parallel::even_split(static_cast<std::int64_t>(P), dp);
        init += static_cast<double>(comm::peer_copy_window_bytes(dp, 4 * counts[0], static_cast<int>(gr.bucket_bytes.size())));
        break;
      }
      case parallel::CopyEngineWindow::bucket_parts: {
        std::vector<parallel::GradBucket> buckets;
        for (double bytes : gr.bucket_bytes) buckets.push_back({0, 0, 0, static_cast<std::int64_t>(bytes / 4)});
        init += static_cast<double>(parallel::CopyEngineAllReduce::window_bytes(buckets, dp));
        break;
      }
      case parallel::CopyEngineWindow::none: break;
    }
    replay::set_reduce_staging(gr, spec, sizes, P, dp_rank);
    out.layout = spec.ep > 1 ? fmt::format("{} over dp/ep = {} x ep {} (this rank's experts)", spec.data_parallel_name(),
                                           spec.gradient_group(), spec.ep)
                 : dp == 1 ? (tp > 1 ? "tensor parallel (local shapes), gradients in 256 MiB buckets"
                                   : "one process, gradients in 256 MiB buckets")
                   : spec.bucket_reduce_scatter() ? "zero2 (gradient buckets of bucket_mb, shard of the optimizer state)"
                   : sharded ? spec.data_parallel_name() + " (flat gradients, gradient shard and 1/dp of the optimizer state)"
                                  : "ddp (flat gradient buffer)";
  }
  init += replay::fp8_state_bytes(cfg, s);   // the FP8 layers' scaling state (precision.mode = fp8)
  // parallel.ep_exchange = copy-engine: the ep all-to-all's receive window and flags, from
  // initialisation on, whatever the strategy (parallel/copy_engine_all_to_all.h).
  if (spec.ep_exchange_window() && s.moe_every > 0)
    init += static_cast<double>(parallel::CopyEngineAllToAll::window_bytes(
        spec.ep, parallel::CopyEngineAllToAll::slot_bytes(model::ModelDims::from(cfg.model), global / dp / accum,
                                                          static_cast<std::size_t>(s.e))));
  auto run = [&](bool keep, bool backward, bool grads_held) {
    Sim m;
    m.cuda = cuda;
    Grads g = gr;
    g.sim = &m;
    // The gradient reduction (and its bf16 copies) is armed by the last micro-batch's hooks:
    // the replay of the first one under grad_accum > 1 makes none.
    g.staging_armed = accum == 1 || grads_held;
    if (grads_held) g.hold_all();
    replay::replay(s, m, g, keep, backward);
    return m.peak;
  };
  // Gradients alive when the backward ends: every bucket (one process, zero2: released after
  // the step / the reduce-scatters), or under FSDP the embedding's full-size gradients, whose
  // reduce-scatter is the one left in flight.
  grads_after = gr.lazy ? gr.total() : fsdp ? 4 * gr.unit_padded[0] : 0.0;
  const double base = init + workspace + lanes_workspace;
  out.phases = {{"init", init + workspace}};
  if (mode == BenchMode::forward) {
    out.phases.push_back({"forward", base + run(false, false, false)});
  } else {
    // What is alive at the forward_backward phase mark (the end of the first micro-batch's
    // backward): the state, the gradients, that micro-batch's inputs, targets and loss sums.
    // The optimizer phase starts there (its peak is at its start; with grad_accum > 1 it also
    // holds micro-batches 2.., run with the buckets already allocated).
    // (MoE: and the micro-batch's router-loss sum, alive with its activations.)
    const double at_mark = base + grads_after + 2 * 4 * s.B * s.T + s.st * static_cast<double>(accum) +
                           (s.moe_every > 0 ? s.st : 0.0);
    // bf16 gradient reduction: the copies are alive from the backward (or, ddp flat, from the
    // sync's finish()) to the end of finish(); made by the micro-batch that arms the reduction.
    const double staging = gr.staging_total();
    double fb = base + run(true, true, false);
    // The copies made during the first (only) micro-batch's backward end it beside its state.
    // In forward-backward mode finish() runs after the mark, so flat's copy (made there) shows
    // in the next step's phase, over the same state.
    if (accum == 1 && (!gr.group_stage.empty() || (gr.finish_stage > 0 && mode == BenchMode::forward_backward)))
      fb = std::max(fb, at_mark + staging);
    out.phases.push_back({"forward_backward", fb});
    if (mode == BenchMode::train_step)
      out.phases.push_back({"optimizer", std::max(at_mark + staging, accum > 1 ? base + run(true, true, true) : 0.0)});
  }
  for (const auto& p : out.phases) out.peak = std::max(out.peak, p.bytes);
  return out;
}

double write_memory_prediction(JobEnv& env) {
  // This rank's prediction (a pipeline rank predicts its own stage) beside its measured peaks.
  const MemoryPhases pred = predict_memory_phases(env.cfg, env.world, env.rt.device() == Device::cuda, env.rank);
  const auto& measured = env.rt.allocator().tracker().phase_peaks();
  std::vector<double> mine;   // per phase: predicted, measured
  for (const auto& p : pred.phases) {
    const auto it = measured.find(p.phase);
    mine.push_back(p.bytes);
    mine.push_back(it == measured.end() ? 0.0 : static_cast<double>(it->second));
  }
  // error = predicted / measured - 1 (negative: the prediction is short); NaN when the phase was
  // not measured (a 0 would read as a perfect prediction).
  auto error = [](double predicted, double got) {
    return got > 0 ? predicted / got - 1 : std::numeric_limits<double>::quiet_NaN();
  };
  using C = io::Column;
  const std::vector<C> columns{{"phase", C::Type::str, ""},
                               {"predicted_bytes", C::Type::f64, "bytes"},
                               {"measured_bytes", C::Type::f64, "bytes"},
                               {"error", C::Type::f64, ""}};
  auto table = env.out.create_table("/bench_model/memory_prediction", columns);
  for (std::size_t i = 0; i < pred.phases.size(); ++i)
    table.append({pred.phases[i].phase, mine[2 * i], mine[2 * i + 1], error(mine[2 * i], mine[2 * i + 1])});
  // Every rank's rows, gathered to rank 0 (the phases are the mode's, the same on every rank).
  std::vector<double> all = mine;
  const bool gathered = env.host_comm && env.world > 1;
  if (gathered) {
    // The phases follow the mode, so every rank has as many; the gather below relies on it.
    const double n_mine = static_cast<double>(mine.size());
    std::vector<double> counts(static_cast<std::size_t>(env.world));
    env.host_comm->all_gather(&n_mine, counts.data(), 1, DType::f64).wait();
    for (double c : counts) LMSCALE_CHECK(c == n_mine, "memory prediction: ranks predict different phases ({} and {})", c, n_mine);
    all.resize(mine.size() * static_cast<std::size_t>(env.world));
    env.host_comm->all_gather(mine.data(), all.data(), mine.size(), DType::f64).wait();
  }
  std::vector<C> rank_columns{{"rank", C::Type::i64, ""}};
  rank_columns.insert(rank_columns.end(), columns.begin(), columns.end());
  auto ranks = env.out.create_table("/bench_model/memory_prediction_ranks", rank_columns);
  const std::size_t n = pred.phases.size();
  for (std::size_t r = 0; r < all.size() / std::max<std::size_t>(1, 2 * n); ++r)
    for (std::size_t i = 0; i < n; ++i) {
      const double p = all[2 * (r * n + i)], got = all[2 * (r * n + i) + 1];
      ranks.append({static_cast<std::int64_t>(gathered ? static_cast<int>(r) : env.rank), pred.phases[i].phase, p,
                    got, error(p, got)});
    }
  env.out.set_attr("/bench_model", "memory_model_layout", pred.layout);
  return pred.peak;
}

}  // namespace lmscale::jobs
