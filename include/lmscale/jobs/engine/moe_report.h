#pragma once
// What a mixture-of-experts training run records (docs/hdf5.md, /train/moe; docs/moe.md): per MoE
// block and logged step, the assignments routed to each expert since the previous logged step,
// the dropped fraction (assignments over the capacity), the mean balance loss per sequence and the
// mean z-loss per token, summed over the data-parallel ranks (every rank counts its own tokens'
// routing, so the sum is the global batch's).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lmscale/io/results.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {

class MoeRecorder {
 public:
  // Creates `table` (/train/moe for train, /bench_model/moe for bench-model) when the model has
  // MoE blocks; otherwise records nothing.
  MoeRecorder(JobEnv& env, Trainer& trainer, const std::string& table = "/train/moe");
  bool active() const { return table_.has_value(); }
  // Collective over the world (one all-reduce): appends one row per MoE block for training step
  // `step` (counted from 1) and resets the model's counters.
  void record(std::int64_t step);

  // How evenly the rows recorded for steps >= `from` were spread (after the capacity's drops):
  // per MoE block and step, the busiest expert's rows over the mean expert's, and the busiest ep
  // rank's (its E/ep experts together: the work its experts do while the others wait at the
  // block's all-to-all, docs/moe.md) over the mean rank's; means over those rows. 1 is even; with
  // dp > ep the counts are the whole world's (the ep groups' loads are not told apart).
  struct Balance {
    double expert_max_over_mean = 0, ep_rank_max_over_mean = 0;
    std::int64_t rows = 0;   // (block, step) pairs counted
  };
  void count_balance_from(std::int64_t from, int ep) { balance_from_ = from, ep_ = ep; }
  Balance balance() const;
  // The rows each expert computed (assignments kept after the capacity), summed over the world,
  // in the last record: [MoE block][expert label] (what parallel.ep_rebalance_every balances).
  const std::vector<std::vector<double>>& last_rows() const { return last_rows_; }

 private:
  JobEnv& env_;
  Trainer& trainer_;
  std::optional<io::Table> table_;
  std::int64_t balance_from_ = 1;
  int ep_ = 1;
  double expert_ratio_sum_ = 0, rank_ratio_sum_ = 0;
  std::int64_t balance_rows_ = 0;
  std::vector<std::vector<double>> last_rows_;
};

}  // namespace lmscale::jobs
