#pragma once
// What a pipeline-parallel run (parallel.pp > 1) records (docs/hdf5.md, /pipeline): per rank and
// stage the forward and backward busy time, the idle (bubble) time and the measured bubble
// fraction beside the theory (p-1)/(M+p-1), the rank's peak memory, and the events (which
// microbatch ran forward or backward when) from which analysis/ draws the schedule's timeline.
#include <cstdint>
#include <vector>

#include "lmscale/jobs/job_env.h"
#include "lmscale/jobs/engine/trainer.h"

namespace lmscale::jobs {

class PipelineRecorder {
 public:
  // Records nothing unless trainer.pipeline() exists.
  PipelineRecorder(JobEnv& env, Trainer& trainer);
  bool active() const { return active_; }
  // After a step whose times count (bench: timed steps; train: every step): adds its stage stats;
  // keeps its events for the first kEventSteps such steps. `step` counts from 0 (the caller's
  // loop index); tables number steps from 1, so its events are written as step + 1.
  void add_step(std::int64_t step);
  // Collective over the world: gathers every rank's stats and events to rank 0, which writes
  // /pipeline/stages and /pipeline/events and prints the bubble summary. Returns the mean
  // measured bubble fraction over ranks.
  double write();

  static constexpr int kEventSteps = 8;

 private:
  JobEnv& env_;
  Trainer& trainer_;
  bool active_ = false;
  std::int64_t steps_ = 0;
  double forward_ms_ = 0, backward_ms_ = 0, span_ms_ = 0;
  std::vector<double> events_;   // per event: step, micro, backward (0/1), start_ms, end_ms, chunk
};

}  // namespace lmscale::jobs
