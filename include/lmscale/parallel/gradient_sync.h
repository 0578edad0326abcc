#pragma once
// What a data-parallel strategy does to gradients between the backward and the optimizer step.
// The model computes each rank's gradient already scaled by 1/(global token count), so the
// global gradient is the SUM over ranks. The default (one process, or dp = 1) does nothing.
#include <string>

#include "lmscale/core/context.h"
#include "lmscale/model/parallel_context.h"

namespace lmscale::parallel {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // Hooks for the backward of micro-batch `micro` of `micro_count` in this step (the last one
  // completes the step's gradients: DDP and ZeRO start reducing only then).
  virtual model::ParallelContext hooks(int micro, int micro_count) {
    (void)micro;
    (void)micro_count;
    return {};
  }
  // Whether parameter i's gradient leaves the model's buffer after every micro-batch's backward
  // (FSDP's sharded units: each micro-batch's full-size gradients are reduce-scattered and freed,
  // the next one writes a fresh buffer) rather than accumulating there until the last one. A
  // wrapper that must see the step's whole gradient before the reduction (expert parallelism's
  // sum over ep) then acts on every micro-batch's part.
  virtual bool reduces_every_micro_batch(int param) const {
    (void)param;
    return false;
  }
  // Hooks for a forward; training: its backward follows (evaluation forwards pass false).
  virtual model::ParallelContext forward_hooks(bool training) {
    (void)training;
    return {};
  }
  // After the last backward: every rank holds the summed gradients it needs (waits for
  // asynchronous reductions). The time spent here is the exposed communication time.
  virtual void finish(Context& ctx) { (void)ctx; }
  // Sum of a host scalar over the data-parallel ranks (loss sums, squared norms).
  virtual double sum_scalar(double x) { return x; }
  virtual std::string name() const { return "none"; }
};

}  // namespace lmscale::parallel
