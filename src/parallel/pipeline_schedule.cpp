#include "lmscale/parallel/pipeline_schedule.h"

#include "lmscale/ops/ops.h"

namespace lmscale::parallel {

namespace {
Tensor zero_loss(Context& ctx) {
  Tensor zero = Tensor::empty({1}, DType::f32, *ctx.allocator, "loss");
  ops::fill(ctx, zero, 0.0);
  return zero;
}
}  // namespace

void PipelineSchedule::forward_backward(const MicroBatchSource& batches, std::int64_t T, double grad_scale,
                                        Strategy& strategy, std::vector<Tensor>& loss_sums, PassTimes& times) {
  (void)times;   // read from the pipeline's events in finish_timing (no host sync here)
  // The rank's rows in parallel.microbatches microbatches (grad_accum is 1 with pp: the deck
  // check refuses anything else), all uploaded before the schedule starts.
  std::vector<Tensor> ins, tgs;
  for (int m = 0; m < microbatches_; ++m) {
    MicroBatch b = batches(m, microbatches_);
    ins.push_back(b.inputs);
    tgs.push_back(b.targets);
  }
  std::vector<Tensor> sums;
  begin_ = rt_.mark();
  {
    ops::Runtime::GemmCarveout carve(rt_, true);   // activations travel beside both passes
    pipeline_->run(ins, tgs, T, grad_scale, false, strategy.sync(), 0, microbatches_, sums);
  }
  end_ = rt_.mark();
  // The last stage holds the loss sums; the others report zeros (summed over stages later).
  while (static_cast<int>(sums.size()) < microbatches_) sums.push_back(zero_loss(rt_.ctx()));
  for (auto& l : sums) loss_sums.push_back(l);
  rt_.allocator().tracker().mark_phase("forward_backward");
}

Tensor PipelineSchedule::forward_only(const MicroBatch& batch, std::int64_t T, Strategy& strategy) {
  ops::Runtime::GemmCarveout carve(rt_, true);
  Tensor loss_sum = pipeline_->forward_only(batch.inputs, batch.targets, T, strategy.forward_hooks(false));
  return loss_sum.defined() ? loss_sum : zero_loss(rt_.ctx());   // not the last stage: contributes 0
}

void PipelineSchedule::finish_timing(PassTimes& times) {
  pipeline_->finish_timing();
  // Forwards and backwards interleave: forward_ms is the stage's forward busy time, backward_ms
  // the rest of its pipeline (backward busy time, transfers and the bubble).
  const auto& st = pipeline_->stats();
  times.forward_ms = st.busy_forward_ms;
  times.backward_ms = rt_.elapsed_ms(begin_, end_) - st.busy_forward_ms;
}

void PipelineSchedule::sum_over_stages(std::vector<double>& values) {
  if (values.empty()) return;
  std::vector<double> out(values.size());
  host_pp_.all_reduce(values.data(), out.data(), values.size(), DType::f64, comm::ReduceOp::sum).wait();
  values = std::move(out);
}

}  // namespace lmscale::parallel
