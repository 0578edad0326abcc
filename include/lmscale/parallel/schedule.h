#pragma once
// How one step's micro-batches run through this rank's model (docs/architecture.md §4), behind one
// call, as Megatron's forward_backward_func: the trainer neither knows nor asks whether a
// pipeline is there.
//   SequentialSchedule  parallel.pp = 1: train.grad_accum micro-batches, each a forward and a
//                       backward of the whole model (sequential_schedule.h);
//   PipelineSchedule    parallel.pp > 1: parallel.microbatches through the stages under gpipe,
//                       1f1b or interleaved (pipeline_schedule.h over parallel/pipeline.h).
// The loss sums stay on the device; the trainer reads them once per step.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "lmscale/core/tensor.h"
#include "lmscale/parallel/strategy.h"

namespace lmscale::parallel {

class PipelineParallel;

// One micro-batch's inputs and targets, int32 [rows, T] on the device.
struct MicroBatch {
  Tensor inputs, targets;
};
// Uploads micro-batch m of `count` (rows [m, m+1) x local rows / count of this rank's batch).
using MicroBatchSource = std::function<MicroBatch(int m, int count)>;

// Device time of a step's passes: forward and backward busy time (pipeline: the forward's busy
// time, and the rest of the stage's span as backward: its backward, transfers and bubble).
struct PassTimes {
  double forward_ms = 0, backward_ms = 0;
};

class Schedule {
 public:
  virtual ~Schedule() = default;
  // Micro-batches per step on this rank.
  virtual int micro_batches() const = 0;
  // One step's forwards and backwards: the first backward overwrites the gradients, later ones
  // add. grad_scale as in TransformerLM::forward. Appends one loss sum (device scalar) per
  // micro-batch to loss_sums: zero on pipeline stages without the head, so every rank makes the
  // same reductions.
  virtual void forward_backward(const MicroBatchSource& batches, std::int64_t T, double grad_scale,
                                Strategy& strategy, std::vector<Tensor>& loss_sums, PassTimes& times) = 0;
  // Forward only (evaluation) of one batch: its loss sum (device scalar; zero without the head).
  virtual Tensor forward_only(const MicroBatch& batch, std::int64_t T, Strategy& strategy) = 0;
  // After the step's last use of its times: fills what only the finished step knows (the
  // pipeline's events; waits for the device). Sequential: nothing.
  virtual void finish_timing(PassTimes& times) { (void)times; }
  // Sum over the pipeline stages of per-rank host values (identity without a pipeline): stages
  // hold disjoint parameters (squared gradient norms add) and only the last holds the loss.
  virtual void sum_over_stages(std::vector<double>& values) { (void)values; }
  // The pipeline (its stage, events and bubble), or null.
  virtual PipelineParallel* pipeline() { return nullptr; }
};

}  // namespace lmscale::parallel
