#pragma once
// parallel.pp > 1: a step is parallel.microbatches micro-batches through the stages under the
// deck's schedule (parallel/pipeline.h runs them; this adapts it to parallel/schedule.h). Loss
// sums and squared norms are summed over the stages on the pp group of the host mesh.
#include <memory>

#include "lmscale/comm/communicator.h"
#include "lmscale/ops/runtime.h"
#include "lmscale/parallel/pipeline.h"
#include "lmscale/parallel/schedule.h"

namespace lmscale::parallel {

class PipelineSchedule final : public Schedule {
 public:
  // pipeline: this rank's stage; host_pp: the host communicator of the same pp group.
  PipelineSchedule(std::unique_ptr<PipelineParallel> pipeline, comm::Communicator& host_pp, ops::Runtime& rt,
                   int microbatches)
      : pipeline_(std::move(pipeline)), host_pp_(host_pp), rt_(rt), microbatches_(microbatches) {}

  int micro_batches() const override { return microbatches_; }
  void forward_backward(const MicroBatchSource& batches, std::int64_t T, double grad_scale, Strategy& strategy,
                        std::vector<Tensor>& loss_sums, PassTimes& times) override;
  Tensor forward_only(const MicroBatch& batch, std::int64_t T, Strategy& strategy) override;
  void finish_timing(PassTimes& times) override;
  void sum_over_stages(std::vector<double>& values) override;
  PipelineParallel* pipeline() override { return pipeline_.get(); }

 private:
  std::unique_ptr<PipelineParallel> pipeline_;
  comm::Communicator& host_pp_;
  ops::Runtime& rt_;
  int microbatches_;
  ops::Runtime::Mark begin_, end_;   // around the step's pipeline (read after the step)
};

}  // namespace lmscale::parallel
