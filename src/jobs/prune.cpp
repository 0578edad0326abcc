#include "lmscale/jobs/prune.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/core/host_vector.h"
#include "lmscale/io/checkpoint.h"
#include "lmscale/io/dataset.h"
#include "lmscale/jobs/magnitude_pruning.h"
#include "lmscale/jobs/engine/trainer.h"

namespace lmscale::jobs {

namespace {

struct Eval {
  double loss = 0;
  double forward_ms = 0;   // median device time of one evaluation batch's forward (this rank's rows)
};

// Mean loss over train.eval_batches held-out global batches (the same batches every time, as
// train's evaluation) and the median forward time. One untimed forward of the first batch runs
// first: a model of a new shape (a structured export) otherwise pays its GEMM plans and allocator
// growth inside the first timed batch.
Eval evaluate(const Config& cfg, Trainer& trainer, const io::TokenSource& data) {
  const std::int64_t T = cfg.model.context_length;
  auto batch = [&](std::int64_t b) {
    auto tokens = host_vector<std::int32_t>(static_cast<std::size_t>(trainer.local_rows() * (T + 1)),
                                            "the evaluation token batch");
    data.sample(static_cast<std::uint64_t>(b), trainer.first_row(), trainer.local_rows(), T, tokens.data(), true);
    return tokens;
  };
  trainer.forward_loss(batch(0), T, nullptr);   // warm-up, not counted
  Eval e;
  std::vector<double> times;
  for (std::int64_t b = 0; b < cfg.train.eval_batches; ++b) {
    StepTimes t;
    e.loss += trainer.forward_loss(batch(b), T, &t);
    times.push_back(t.forward_ms);
  }
  e.loss /= static_cast<double>(cfg.train.eval_batches);
  std::sort(times.begin(), times.end());
  const std::size_t n = times.size();
  e.forward_ms = n == 0 ? 0.0 : (n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]));
  return e;
}

std::vector<float> read_weights(const std::string& path, const model::ModelDims& dims) {
  io::CheckpointReader r(path);
  const auto layout = model::parameter_layout(dims);
  std::vector<float> flat(static_cast<std::size_t>(dims.parameter_count()));
  for (const auto& p : layout) r.read(p.name, p.shape, flat.data() + p.offset);
  return flat;
}

// The structurally pruned model: a deck with the smaller d_ff and a trainer for it (evaluation
// only), loaded with the compacted weights.
struct CompactModel {
  Config cfg;
  std::unique_ptr<JobEnv> env;
  std::unique_ptr<Trainer> trainer;
};
std::unique_ptr<CompactModel> compact_model(JobEnv& env, std::int64_t d_ff, const std::vector<float>& weights) {
  auto m = std::make_unique<CompactModel>();
  m->cfg = env.cfg;
  m->cfg.model.d_ff = d_ff;
  m->env = std::make_unique<JobEnv>(JobEnv{m->cfg, env.mpi, env.rt, env.out, env.rank, env.world, env.local_rank,
                                           env.comm, env.host_comm});
  m->trainer = std::make_unique<Trainer>(*m->env, env.cfg.train.batch_size, 1, 1);
  m->trainer->set_parameters(weights);
  return m;
}

}  // namespace

int run_prune(JobEnv& env) {
  const Config& cfg = env.cfg;
  const auto& pc = cfg.prune;
  const bool structured = pc.method == PruneMethod::structured;
  const bool guided = pc.schedule == PruneSchedule::loss_guided;
  const std::int64_t T = cfg.model.context_length;
  const auto dims = model::ModelDims::from(cfg.model);
  const std::int64_t max_rounds = fixed_rounds(pc.theta, pc.target_sparsity);
  auto data = io::make_token_source(cfg.data, cfg.model.vocab_size, cfg.run.seed);
  // One LR schedule over all the fine-tuning steps the run may take.
  Trainer trainer(env, cfg.train.batch_size, cfg.train.grad_accum, std::max<std::int64_t>(1, max_rounds * pc.finetune_steps));
  std::vector<float> w = read_weights(pc.weights, dims);
  trainer.set_parameters(w);

  // The pruned set: every element of the attention and FFN matrices (unstructured) or the FFN
  // units (structured); "kept" counts what is left of it.
  const std::int64_t n_set = structured ? dims.d_ff : prunable_count(dims);
  std::vector<std::uint8_t> mask = full_mask(dims);
  UnitMask units = full_unit_mask(dims);
  using C = io::Column;
  auto table = env.out.create_table("/prune/rounds", {{"round", C::Type::i64, ""},
                                                      {"sparsity", C::Type::f64, ""},
                                                      {"kept", C::Type::i64, ""},
                                                      {"parameters_kept", C::Type::i64, ""},
                                                      {"d_ff", C::Type::i64, ""},
                                                      {"val_loss", C::Type::f64, "nats"},
                                                      {"export_val_loss", C::Type::f64, "nats"},
                                                      {"forward_ms", C::Type::f64, "ms"},
                                                      {"export_forward_ms", C::Type::f64, "ms"},
                                                      {"accepted", C::Type::i64, ""}});
  // Nonzero parameters of the whole model given the kept part of the set.
  const std::int64_t total = dims.parameter_count();
  auto parameters_kept = [&](std::int64_t kept) {
    if (!structured) return total - (prunable_count(dims) - kept);
    return total - 3 * dims.layers * dims.d_model * (dims.d_ff - kept);
  };

  const Eval base = evaluate(cfg, trainer, *data);
  const double bound = pc.max_loss > 0 ? pc.max_loss : base.loss * (1.0 + pc.max_loss_increase);
  table.append({std::int64_t{0}, 0.0, n_set, total, dims.d_ff, base.loss, base.loss, base.forward_ms, base.forward_ms,
                std::int64_t{1}});
  table.flush();
  if (env.is_root()) {
    fmt::print("prune: {} {} pruning of {} ({} parameters; the pruned set: {} {}), target sparsity {}, gamma {:.4f} "
               "(theta {}), {} fine-tuning steps per round, data: {}\n",
               pc.schedule, pc.method, pc.weights, total, n_set, structured ? "FFN units per block" : "matrix weights",
               pc.target_sparsity, 1.0 - std::pow(0.1, 1.0 / static_cast<double>(pc.theta)), pc.theta,
               pc.finetune_steps, data->describe());
    if (guided) fmt::print("loss-guided: prune while the validation loss stays <= {:.4f}\n", bound);
    fmt::print("{:>5} {:>9} {:>12} {:>10} {:>10} {:>10}\n", "round", "sparsity", "params kept", "val loss",
               structured ? "export" : "", "fwd ms");
    fmt::print("{:>5} {:>9.4f} {:>12} {:>10.4f} {:>10} {:>10.3f}\n", 0, 0.0, total, base.loss, "", base.forward_ms);
  }

  std::uint64_t data_step = 0;
  std::vector<float> accepted_w = w;   // the last state within the bound (loss-guided)
  std::vector<std::uint8_t> accepted_mask = mask;
  UnitMask accepted_units = units;
  std::int64_t accepted_round = 0;
  double final_loss = base.loss;
  std::unique_ptr<CompactModel> compact;
  for (std::int64_t round = 1; round <= max_rounds; ++round) {
    const double keep_frac = kept_fraction(round, pc.theta, pc.target_sparsity);
    // Round to a count; the last round lands exactly on the target's count.
    const std::int64_t keep = round == max_rounds
                                  ? n_set - std::llround(pc.target_sparsity * static_cast<double>(n_set))
                                  : std::llround(keep_frac * static_cast<double>(n_set));
    w = trainer.full_parameters();
    if (structured) {
      prune_units(dims, w, units, std::max<std::int64_t>(1, keep));
      mask = unit_element_mask(dims, units);
    } else {
      prune_unstructured(dims, w, mask, keep);
    }
    apply_mask(w, mask);
    trainer.set_parameters(w);
    // Fine-tuning with the mask held: the pruned weights are set to zero again after every
    // optimizer step (AdamW's moments and decay would otherwise move them).
    for (std::int64_t s = 0; s < pc.finetune_steps; ++s, ++data_step) {
      auto tokens = host_vector<std::int32_t>(static_cast<std::size_t>(trainer.local_rows() * (T + 1)),
                                              "the fine-tuning token batch");
      data->sample(data_step, trainer.first_row(), trainer.local_rows(), T, tokens.data(), false);
      trainer.train_step(tokens, T);
      w = trainer.full_parameters();
      apply_mask(w, mask);
      trainer.set_parameters(w);
    }
    env.rt.synchronize();
    const Eval e = evaluate(cfg, trainer, *data);
    const std::int64_t kept = structured ? kept_units(units) : n_set - prunable_zeros(dims, w);
    Eval ex{NAN, NAN};
    if (structured) {   // the physically smaller model must give the masked model's loss
      compact = compact_model(env, kept, compact_units(dims, w, units));
      ex = evaluate(compact->cfg, *compact->trainer, *data);
    }
    const bool within = !guided || e.loss <= bound;
    const double sparsity = 1.0 - static_cast<double>(kept) / static_cast<double>(n_set);
    table.append({round, sparsity, kept, parameters_kept(kept), structured ? kept : dims.d_ff, e.loss, ex.loss,
                  e.forward_ms, ex.forward_ms, static_cast<std::int64_t>(within)});
    table.flush();
    if (env.is_root())
      fmt::print("{:>5} {:>9.4f} {:>12} {:>10.4f} {:>10} {:>10.3f}{}\n", round, sparsity, parameters_kept(kept), e.loss,
                 structured ? fmt::format("{:.4f}", ex.loss) : "", structured ? ex.forward_ms : e.forward_ms,
                 within ? "" : fmt::format("  above the bound {:.4f}: stop, keep round {}", bound, accepted_round));
    if (!within) break;
    accepted_w = w;
    accepted_mask = mask;
    accepted_units = units;
    accepted_round = round;
    final_loss = e.loss;
  }

  const std::int64_t final_kept = structured ? kept_units(accepted_units) : n_set - prunable_zeros(dims, accepted_w);
  const std::string g = "/prune";
  env.out.set_attr(g, "weights", pc.weights);
  env.out.set_attr(g, "method", to_string(pc.method));
  env.out.set_attr(g, "schedule", to_string(pc.schedule));
  env.out.set_attr(g, "target_sparsity", pc.target_sparsity);
  env.out.set_attr(g, "gamma", 1.0 - std::pow(0.1, 1.0 / static_cast<double>(pc.theta)));
  env.out.set_attr(g, "theta", pc.theta);
  env.out.set_attr(g, "finetune_steps", pc.finetune_steps);
  env.out.set_attr(g, "pruned_set_size", n_set);
  env.out.set_attr(g, "final_round", accepted_round);
  env.out.set_attr(g, "final_sparsity", 1.0 - static_cast<double>(final_kept) / static_cast<double>(n_set));
  env.out.set_attr(g, "final_val_loss", final_loss);
  env.out.set_attr(g, "unpruned_val_loss", base.loss);
  if (guided) env.out.set_attr(g, "loss_bound", bound);
  if (!pc.output.empty() && env.is_root()) {
    // Structured: the smaller model's parameters; unstructured: the masked full-size ones.
    model::ModelDims out_dims = dims;
    std::vector<float> out = accepted_w;
    if (structured) {
      out_dims.d_ff = final_kept;
      out = compact_units(dims, accepted_w, accepted_units);
    }
    std::vector<io::NamedArray> arrays;
    for (const auto& p : model::parameter_layout(out_dims)) arrays.push_back({p.name, p.shape, out.data() + p.offset});
    io::write_weights(pc.output, arrays,
                      {{"d_ff", out_dims.d_ff},
                       {"num_heads", cfg.model.num_heads},
                       {"rope_theta", cfg.model.rope_theta},
                       {"pruned_from", pc.weights},
                       {"prune_method", to_string(pc.method)},
                       {"sparsity", 1.0 - static_cast<double>(final_kept) / static_cast<double>(n_set)},
                       {"config", cfg.resolved}});
    fmt::print("pruned weights (round {}, {}) written to {}{}\n", accepted_round,
               structured ? fmt::format("d_ff {}", out_dims.d_ff) : fmt::format("{} of {} matrix weights zero",
                                                                                n_set - final_kept, n_set),
               pc.output, structured ? fmt::format("; load it with model.d_ff = {}", out_dims.d_ff) : "");
  }
  return 0;
}

}  // namespace lmscale::jobs
