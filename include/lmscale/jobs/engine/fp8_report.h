#pragma once
// What a precision.mode = fp8 run records of its FP8 scaling (docs/hdf5.md, `GROUP/fp8` and
// `GROUP/fp8_amax_history`; docs/precision.md): per recorded step, each block's FP8 layer (qkv,
// o, w13, w2: model::kFp8BlockGemms) and operand (x, w, dy), the amax of its last cast, the largest amax of its
// history and the scale in use; at the end, every operand's amax history. Rank 0's state is
// written (each data-parallel rank scales its own rows). Every rank warns on stderr, once per
// operand, when its last cast saturated (amax x scale > the format's largest value: values were
// clipped), which delayed scaling allows and current scaling does not.
#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "lmscale/io/results.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {

class Fp8Recorder {
 public:
  // group: "/train" or "/bench_model". Records nothing unless the model runs FP8 layers.
  Fp8Recorder(JobEnv& env, Trainer& trainer, std::string group);
  bool active() const { return table_.has_value(); }
  // Reads every operand's scaling state (a device-to-host copy each), appends its rows for step
  // `step` (counted from 1) and prints the saturation warnings not printed before.
  void record(std::int64_t step);
  // Writes GROUP/fp8_amax_history [L, 4, 3, H] (oldest cast first) and the run's attributes.
  void finish();
  // Operands whose saturation was reported so far (this rank).
  std::size_t saturated_operands() const { return warned_.size(); }

 private:
  JobEnv& env_;
  Trainer& trainer_;
  std::string group_;
  std::optional<io::Table> table_;
  std::set<std::string> warned_;
};

}  // namespace lmscale::jobs
