// The mixture-of-experts terms of the accounting (jobs/predict/accounting.h, docs/moe.md):
// parameters total and active, expert state per rank, all-to-all bytes per step.
#include <algorithm>

#include <fmt/format.h>

#include "lmscale/parallel/spec.h"
#include "lmscale/jobs/predict/accounting.h"
#include "lmscale/model/model_dims.h"

namespace lmscale::jobs {

MoeAccounting account_moe(const Config& cfg, int world) {
  MoeAccounting a;
  const auto m = model::ModelDims::from(cfg.model);
  a.total_parameters = m.parameter_count();
  a.active_parameters = m.active_parameter_count();
  a.expert_parameters = m.expert_parameter_count();
  a.ep = cfg.parallel.ep;
  // fp32 master weights, gradients and AdamW's m and v: 16 bytes per parameter of its experts.
  a.expert_state_bytes_per_rank = 16.0 * static_cast<double>(a.expert_parameters) / static_cast<double>(a.ep);
  // Per MoE block and micro-batch each rank sends its kept assignments' rows to the experts' ranks
  // and receives them back: 2 all-to-alls in the forward, 2 in the backward (every-k
  // checkpointing: 2 more in the recompute). Dropless with uniform routing, a rank's N k rows
  // go to another rank with probability (ep - 1) / ep. Rows are d_model fp32 values.
  const bool bench = cfg.run.job == JobKind::bench_model;
  const std::int64_t B = bench ? cfg.bench.batch_size : cfg.train.batch_size;
  const std::int64_t dp = parallel::Spec::resolve(cfg.parallel, world).mesh_shape().dp;
  const double rows = static_cast<double>(B / dp * m.context * m.moe_top_k);   // per rank per step
  const int passes = cfg.train.activation_checkpointing == Checkpointing::every_k ? 6 : 4;
  const double remote = static_cast<double>(a.ep - 1) / static_cast<double>(a.ep);
  a.all_to_all_bytes_per_step =
      passes * static_cast<double>(m.moe_block_count()) * rows * remote * static_cast<double>(m.d_model) * 4.0;
  a.all_to_all_formula = fmt::format("{} all-to-alls x {} MoE blocks x {} rows (local tokens x top-k) x (ep-1)/ep = {:.3g} "
                                     "x d_model {} x 4 bytes (dropless, uniform routing)",
                                     passes, m.moe_block_count(), rows, remote, m.d_model);
  return a;
}

HeldParameters held_parameters(const Config& cfg, int world) {
  const auto m = model::ModelDims::from(cfg.model);
  const parallel::Spec spec = parallel::Spec::resolve(cfg.parallel, world);
  HeldParameters h;
  h.held = static_cast<double>(m.parameter_count());
  h.ep = spec.ep;
  h.shard_ranks = spec.gradient_group();
  h.held_name = "P";
  h.shard_name = "N";
  if (spec.ep > 1 && m.moe()) {
    h.experts = static_cast<double>(m.expert_parameter_count());
    h.held = h.held - h.experts + h.experts / spec.ep;
    h.held_name = "(P - Pe + Pe/ep)";
    h.shard_name = "(dp/ep)";
  }
  return h;
}

void write_moe_accounting(JobEnv& env, const MoeAccounting& a) {
  const std::string g = "/accounting/moe";
  env.out.set_attr(g, "parameters_total", a.total_parameters);
  env.out.set_attr(g, "parameters_active", a.active_parameters);
  env.out.set_attr(g, "expert_parameters", a.expert_parameters);
  env.out.set_attr(g, "ep", a.ep);
  env.out.set_attr(g, "expert_state_bytes_per_rank", a.expert_state_bytes_per_rank);
  env.out.set_attr(g, "all_to_all_bytes_per_step_per_rank", a.all_to_all_bytes_per_step);
  env.out.set_attr(g, "all_to_all_formula", a.all_to_all_formula);
  if (!env.is_root()) return;
  fmt::print("moe: {} parameters in all, {} active per token ({:.1f}%), {} in the experts\n", a.total_parameters,
             a.active_parameters, 100.0 * static_cast<double>(a.active_parameters) / static_cast<double>(a.total_parameters),
             a.expert_parameters);
  fmt::print("moe: expert state per rank (ep {}): {:.3f} GiB (fp32 weights, gradients, AdamW m and v)\n", a.ep,
             a.expert_state_bytes_per_rank / (1u << 30));
  fmt::print("moe: all-to-all per step per rank: {:.3f} GiB ({})\n", a.all_to_all_bytes_per_step / (1u << 30),
             a.all_to_all_formula);
}

}  // namespace lmscale::jobs
