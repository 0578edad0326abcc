#include "lmscale/jobs/engine/moe_report.h"

#include <algorithm>

#include <fmt/format.h>

#include "lmscale/comm/communicator.h"
#include "lmscale/core/error.h"

namespace lmscale::jobs {

MoeRecorder::MoeRecorder(JobEnv& env, Trainer& trainer, const std::string& table) : env_(env), trainer_(trainer) {
  const auto& d = trainer.dims();
  if (!d.moe()) return;
  using C = io::Column;
  std::vector<C> columns{{"step", C::Type::i64, ""},
                         {"layer", C::Type::i64, ""},
                         {"tokens", C::Type::i64, "tokens"},
                         {"dropped_fraction", C::Type::f64, ""},
                         {"balance_loss", C::Type::f64, ""},
                         {"z_loss", C::Type::f64, ""}};
  for (std::int64_t e = 0; e < d.moe_experts; ++e)
    columns.push_back({fmt::format("expert_{}", e), C::Type::i64, "assignments"});
  table_ = env.out.create_table(table, columns);
  trainer.recording_model().reset_moe_stats();
}

void MoeRecorder::record(std::int64_t step) {
  if (!table_) return;
  model::TransformerLM& model = trainer_.recording_model();
  const auto& stats = model.moe_stats(env_.rt.ctx());
  const std::size_t E = static_cast<std::size_t>(trainer_.dims().moe_experts);
  // Per block: tokens, balance sum, z sum, E routed, E kept; summed over the ranks.
  const std::size_t per = 3 + 2 * E;
  std::vector<double> sums(per * stats.size());
  for (std::size_t b = 0; b < stats.size(); ++b) {
    double* s = sums.data() + b * per;
    s[0] = static_cast<double>(stats[b].tokens);
    s[1] = stats[b].balance_sum;
    s[2] = stats[b].z_sum;
    for (std::size_t e = 0; e < E; ++e) {
      s[3 + e] = static_cast<double>(stats[b].routed[e]);
      s[3 + E + e] = static_cast<double>(stats[b].kept[e]);
    }
  }
  if (env_.host_comm && env_.host_comm->size() > 1)
    env_.host_comm->all_reduce(sums.data(), sums.data(), sums.size(), DType::f64, comm::ReduceOp::sum).wait();
  last_rows_.assign(stats.size(), std::vector<double>(E, 0.0));
  for (std::size_t b = 0; b < stats.size(); ++b) {
    const double* s = sums.data() + b * per;
    std::copy_n(s + 3 + E, E, last_rows_[b].begin());
    double routed = 0, kept = 0;
    for (std::size_t e = 0; e < E; ++e) routed += s[3 + e], kept += s[3 + E + e];
    io::Row row{step, static_cast<std::int64_t>(stats[b].layer), static_cast<std::int64_t>(s[0]),
                routed > 0 ? (routed - kept) / routed : 0.0, s[0] > 0 ? s[1] / s[0] : 0.0, s[0] > 0 ? s[2] / s[0] : 0.0};
    for (std::size_t e = 0; e < E; ++e) row.push_back(static_cast<std::int64_t>(s[3 + e]));
    table_->append(row);
    if (step >= balance_from_ && kept > 0) {
      const std::size_t per_rank = E / static_cast<std::size_t>(std::max(1, ep_));
      double busiest_expert = 0, busiest_rank = 0;
      for (std::size_t e = 0; e < E; ++e) busiest_expert = std::max(busiest_expert, s[3 + E + e]);
      for (std::size_t r = 0; r * per_rank < E; ++r) {
        double rows = 0;
        for (std::size_t e = r * per_rank; e < (r + 1) * per_rank; ++e) rows += s[3 + E + e];
        busiest_rank = std::max(busiest_rank, rows);
      }
      expert_ratio_sum_ += busiest_expert / (kept / static_cast<double>(E));
      rank_ratio_sum_ += busiest_rank / (kept / static_cast<double>(E / per_rank));
      ++balance_rows_;
    }
  }
  table_->flush();
  model.reset_moe_stats();
}

MoeRecorder::Balance MoeRecorder::balance() const {
  Balance b;
  b.rows = balance_rows_;
  if (balance_rows_ == 0) return b;
  b.expert_max_over_mean = expert_ratio_sum_ / static_cast<double>(balance_rows_);
  b.ep_rank_max_over_mean = rank_ratio_sum_ / static_cast<double>(balance_rows_);
  return b;
}

}  // namespace lmscale::jobs
