#include "lmscale/parallel/sequential_schedule.h"

namespace lmscale::parallel {

void SequentialSchedule::forward_backward(const MicroBatchSource& batches, std::int64_t T, double grad_scale,
                                          Strategy& strategy, std::vector<Tensor>& loss_sums, PassTimes& times) {
  (void)T;
  Context& ctx = rt_.ctx();
  for (int m = 0; m < grad_accum_; ++m) {
    const MicroBatch b = batches(m, grad_accum_);
    // The first micro-batch overwrites the gradients, later ones add to them. The forward runs the
    // head unit's backward (fused LM head + cross-entropy), so it gets the micro-batch's backward
    // hooks as well as the forward ones (taken in this order: FSDP's forward hooks close a step
    // left open, its backward hooks open this one).
    const bool accumulate = m > 0;
    model::ParallelContext pc = strategy.forward_hooks(true);
    pc.tp = tp_;
    pc.ep = ep_;
    const model::ParallelContext bpc = strategy.sync().hooks(m, grad_accum_);
    pc.on_grad_ready = bpc.on_grad_ready;
    pc.before_backward = bpc.before_backward;
    pc.after_backward = bpc.after_backward;
    auto t0 = rt_.mark();
    std::unique_ptr<model::Activations> act;
    {
      // parallel.comm_sms: GEMMs beside the strategy's collectives (ops::Runtime::GemmCarveout).
      ops::Runtime::GemmCarveout carve(rt_, strategy.communicates_in_forward());
      act = model_.forward(ctx, b.inputs, b.targets, true, grad_scale, pc, accumulate);
    }
    strategy.settle();   // (the forward waited per unit; this only drops an empty queue)
    auto t1 = rt_.mark();
    {
      ops::Runtime::GemmCarveout carve(rt_, strategy.communicates_in_backward());
      model_.backward(ctx, *act, pc, accumulate);
    }
    auto t2 = rt_.mark();
    loss_sums.push_back(act->loss_sum);
    times.forward_ms += rt_.elapsed_ms(t0, t1);
    times.backward_ms += rt_.elapsed_ms(t1, t2);
    if (m == 0) rt_.allocator().tracker().mark_phase("forward_backward");
  }
}

Tensor SequentialSchedule::forward_only(const MicroBatch& batch, std::int64_t T, Strategy& strategy) {
  (void)T;
  model::ParallelContext pc = strategy.forward_hooks(false);
  pc.tp = tp_;
  pc.ep = ep_;
  ops::Runtime::GemmCarveout carve(rt_, strategy.communicates_in_forward());
  return model_.forward(rt_.ctx(), batch.inputs, batch.targets, false, 1.0, pc)->loss_sum;
}

}  // namespace lmscale::parallel
