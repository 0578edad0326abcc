#pragma once
// What a mixture-of-experts training run records (docs/hdf5.md, /train/moe; docs/moe.md): per MoE
// block and logged step, the assignments routed to each expert since the previous logged step,
// the dropped fraction (assignments over the capacity), the mean balance loss per sequence and the
// mean z-loss per token, summed over the data-parallel ranks (every rank counts its own tokens'
// routing, so the sum is the global batch's).
#include <cstdint>
#include <optional>

#include "lmscale/io/results.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {

class MoeRecorder {
 public:
  // Creates /train/moe when the model has MoE blocks; otherwise records nothing.
  MoeRecorder(JobEnv& env, Trainer& trainer);
  bool active() const { return table_.has_value(); }
  // Collective over the world (one all-reduce): appends one row per MoE block for training step
  // `step` (counted from 1) and resets the model's counters.
  void record(std::int64_t step);

 private:
  JobEnv& env_;
  Trainer& trainer_;
  std::optional<io::Table> table_;
};

}  // namespace lmscale::jobs
