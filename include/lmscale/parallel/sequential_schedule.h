#pragma once
// parallel.pp = 1: a step is train.grad_accum micro-batches, each a forward and a backward of
// the whole model (parallel/schedule.h).
#include "lmscale/model/transformer.h"
#include "lmscale/ops/runtime.h"
#include "lmscale/parallel/schedule.h"

namespace lmscale::parallel {

class SequentialSchedule final : public Schedule {
 public:
  // tp, ep: the tensor- and expert-parallel collectives every model call gets (empty without).
  SequentialSchedule(model::TransformerLM& model, ops::Runtime& rt, int grad_accum, model::TensorParallelComm tp,
                     model::ExpertParallelComm ep = {})
      : model_(model), rt_(rt), grad_accum_(grad_accum), tp_(std::move(tp)), ep_(std::move(ep)) {}

  int micro_batches() const override { return grad_accum_; }
  void forward_backward(const MicroBatchSource& batches, std::int64_t T, double grad_scale, Strategy& strategy,
                        std::vector<Tensor>& loss_sums, PassTimes& times) override;
  Tensor forward_only(const MicroBatch& batch, std::int64_t T, Strategy& strategy) override;

 private:
  model::TransformerLM& model_;
  ops::Runtime& rt_;
  int grad_accum_;
  model::TensorParallelComm tp_;
  model::ExpertParallelComm ep_;
};

}  // namespace lmscale::parallel
