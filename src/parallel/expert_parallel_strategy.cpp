// A data-parallel strategy over expert_dp with the ep group's share (parallel/expert_parallel_strategy.h).
#include "lmscale/parallel/expert_parallel_strategy.h"

#include <algorithm>

#include "lmscale/core/error.h"
#include "lmscale/optim/grad_clip.h"
#include "lmscale/parallel/sharded_optimizer.h"

namespace lmscale::parallel {

// The inner strategy's synchronisation with the dense gradients summed over the ep group first.
class ExpertParallelStrategy::Sync final : public GradientSync {
 public:
  Sync(GradientSync& inner, ExpertParallel& ep, model::ParameterStore& store, comm::Communicator& dp_host)
      : inner_(inner), ep_(ep), store_(store), dp_host_(dp_host) {}

  model::ParallelContext hooks(int micro, int micro_count) override {
    model::ParallelContext pc = inner_.hooks(micro, micro_count);
    // A gradient that accumulates in place is summed over ep once, in the last micro-batch (the
    // sum is of the step's whole gradient); one the inner strategy reduces after every
    // micro-batch (FSDP's units: reduce-scattered and freed in after_backward) is summed in every
    // micro-batch, before that reduction: the sum over ep of each part is the part of the sum.
    const bool last = micro == micro_count - 1;
    // On GPUs, without an inner hook, nothing reads a summed gradient before finish(): the sums
    // run asynchronously behind the rest of the backward, and finish() waits for them all (one
    // wait instead of a stall of the compute stream per dense parameter). An inner hook reduces
    // the gradient over expert_dp as soon as it is called, and fsdp reduce-scatters (and frees) a
    // unit's gradients after its backward: those sums are waited on first. On CPUs (mpi) each sum
    // blocks: an asynchronous one would run on the communication thread beside the main
    // thread's MPI calls.
    // The asynchronous sums go out in groups of about kGroupBytes (one NCCL launch each): every
    // ep rank holds the same dense parameters and becomes ready for them in the same order, so
    // the groups match across the ranks.
    const bool async_hooks = !pc.on_grad_ready && ep_.async_sums();
    pc.on_grad_ready = [this, last, async_hooks, inner = pc.on_grad_ready](int i) {
      if (!ExpertParallel::holds_slice(store_.infos()[static_cast<std::size_t>(i)]) &&
          (last || inner_.reduces_every_micro_batch(i))) {
        Tensor g = store_.grad(i);
        if (async_hooks && !inner_.reduces_every_micro_batch(i)) {
          ready_bytes_ += static_cast<std::size_t>(g.numel()) * dtype_size(g.dtype());
          ready_.push_back(g);
          if (ready_bytes_ >= kGroupBytes) flush();
        } else {
          ep_.sum_gradient(g, false);
        }
      }
      if (inner) inner(i);
    };
    return pc;
  }
  bool reduces_every_micro_batch(int param) const override { return inner_.reduces_every_micro_batch(param); }
  model::ParallelContext forward_hooks(bool training) override { return inner_.forward_hooks(training); }
  void finish(Context& ctx) override {
    flush();
    for (comm::Work& w : pending_) w.wait();
    pending_.clear();
    inner_.finish(ctx);
  }
  double sum_scalar(double x) override { return comm::sum_over(dp_host_, x); }
  std::string name() const override { return inner_.name() + " x ep"; }

 private:
  GradientSync& inner_;
  ExpertParallel& ep_;
  model::ParameterStore& store_;
  comm::Communicator& dp_host_;
  // Sends the ready dense gradients' sums as one group.
  void flush() {
    if (ready_.empty()) return;
    pending_.push_back(ep_.sum_gradients(ready_));
    ready_.clear();
    ready_bytes_ = 0;
  }

  // About one block's dense gradients of a 1B model (16 MB in fp32): few launches, and the sums
  // still run behind the rest of the backward.
  static constexpr std::size_t kGroupBytes = std::size_t{16} << 20;
  std::vector<comm::Work> pending_;   // the dense gradients' sums in flight (async hooks only)
  std::vector<Tensor> ready_;         // ready for their sum, not yet sent (async hooks only)
  std::size_t ready_bytes_ = 0;
};

ExpertParallelStrategy::ExpertParallelStrategy(const StrategyParts& parts, std::unique_ptr<Strategy> inner,
                                               ExpertParallel& ep, comm::Communicator& dp_host)
    : Strategy(parts), inner_(std::move(inner)), ep_(ep) {
  LMSCALE_CHECK(!tp_ && !parts.pipeline,
                "expert parallelism composes with one process, DDP, zero1, zero2 and fsdp only (deck checks)");
  sync_ = std::make_unique<Sync>(inner_->sync(), ep_, store_, dp_host);
}

ExpertParallelStrategy::~ExpertParallelStrategy() = default;

GradientSync& ExpertParallelStrategy::sync() { return *sync_; }

double ExpertParallelStrategy::grad_sum_squares(Context& ctx) {
  // The inner strategy's sum counts every element once over expert_dp; the expert part of it is
  // taken where the inner strategy keeps the reduced gradients (its shards, or the whole store).
  const double all = inner_->grad_sum_squares(ctx);
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  std::vector<Tensor> parts;
  for (int i = 0; i < store_.size(); ++i) {
    const auto& p = store_.infos()[static_cast<std::size_t>(i)];
    if (!ExpertParallel::holds_slice(p)) continue;
    ranges.emplace_back(p.offset, p.numel);
    if (!inner_->sharded()) parts.push_back(store_.grad(i));
  }
  double experts = 0;
  if (inner_->sharded()) experts = inner_->sharded()->grad_sum_squares_in(ctx, ranges);
  else if (!parts.empty()) experts = optim::sum_of_squares(ctx, parts);
  return ep_.global_sum_squares(all, experts);
}

StateLayout ExpertParallelStrategy::state_layout() {
  StateLayout out = inner_->state_layout();
  if (ep_.rank() == 0) return out;
  // The dense pieces' copies on the other ep ranks are not written (ep rank 0's replicas do).
  const auto layout = store_.infos();
  out.save.erase(std::remove_if(out.save.begin(), out.save.end(),
                                [&](const StatePiece& piece) {
                                  const int local = store_.local_index(piece.param);
                                  return !ExpertParallel::holds_slice(layout[static_cast<std::size_t>(local)]);
                                }),
                 out.save.end());
  return out;
}

}  // namespace lmscale::parallel
