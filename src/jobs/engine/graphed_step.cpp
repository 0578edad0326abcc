// Trainer's train step under train.cuda_graphs (jobs/engine/graphed_step.h; docs/architecture.md
// §5, "The captured step"): a key's first step eager, the second captured, every step replayed.
//
// Inside the graph nothing waits for the device and no kernel takes a per-step host value:
//   tokens      -> copied into the fixed input buffers before the replay
//   lr, t       -> AdamW's scalars, one host-to-device copy before the replay (ops/device_step.h)
//   grad norm   -> summed, clipped and checked for finiteness on the device (ops::clip_grad_scale);
//                  the AdamW kernel reads the clipped scale and skips a non-finite step itself
//   loss scale  -> part of the key: a new scale (fp16 backoff or growth) is a new capture
// After the replay the host reads the norm and the loss (as the eager step does), then does what
// the eager step's host code does with them: the loss scaler's update, the skipped flag, t.
#include <cmath>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/ops/device_step.h"
#include "lmscale/ops/ops.h"
#include "lmscale/optim/adamw.h"

namespace lmscale::jobs {

namespace {
optim::AdamW& adamw_of(parallel::Strategy& s) {
  auto* a = dynamic_cast<optim::AdamW*>(s.whole_optimizer());
  LMSCALE_CHECK(a, "train.cuda_graphs: AdamW over the whole store only (deck checks)");
  return *a;
}
}  // namespace

GraphStats Trainer::graph_stats() const {
  GraphStats g = graph_stats_;
  if (graphed_ && graphed_->graph) {
    g.nodes = graphed_->graph->nodes();
    g.pool_bytes = graphed_->graph->pool_bytes();
  }
  return g;
}

void Trainer::capture_step(std::int64_t T) {
  NvtxRange range("capture_step");
  Context& ctx = env_.rt.ctx();
  const OptimConfig& oc = env_.cfg.optim;
  optim::AdamW& adamw = adamw_of(*strategy_);
  settle_optimizer();
  // Buffers the replays read or the host reads back, allocated before the capture (outside the
  // graph's pool): the inputs, the clip slots, AdamW's scalars.
  auto g = std::make_unique<GraphedStep>();
  g->T = T;
  g->loss_scale = scaler_.scale();
  const int accum = run_->micro_batches();
  const std::int64_t rows = local_rows_ / accum;
  for (int m = 0; m < accum; ++m)
    g->inputs.push_back({Tensor::empty({rows, T}, DType::i32, *ctx.allocator, "batch"),
                         Tensor::empty({rows, T}, DType::i32, *ctx.allocator, "batch")});
  g->clip = Tensor::empty({ops::kClipSlots}, DType::f64, *ctx.allocator, "grad_clip");
  if (!adamw_scalars_.defined())
    adamw_scalars_ = Tensor::empty({ops::kAdamWScalars}, DType::f32, *ctx.allocator, "optimizer_scalars");
  // The fixed buffers must not be filled by work still queued from the eager step.
  env_.rt.synchronize();

  const double inv_scale = 1.0 / g->loss_scale;
  const std::int64_t t0 = adamw.steps();
  const double lr = schedule_.at(step_);   // a valid value for the checks; the kernel reads the device's
  g->graph = std::make_unique<ops::CudaGraph>(env_.rt);
  adamw.set_device_step(&adamw_scalars_, &g->clip);
  try {
    g->graph->capture([&] {
      StepResult untimed;
      std::vector<Tensor> loss_sums;
      auto fixed = [&](int m, int count) {
        LMSCALE_CHECK(count == accum, "captured step: {} micro-batches, captured with {}", count, accum);
        return g->inputs[static_cast<std::size_t>(m)];
      };
      run_micro_batches(fixed, T, untimed, loss_sums);
      // The eager step's norm and clip (trainer.cpp), on the device: the same partial sums, the
      // same double arithmetic (ops/device_step.h).
      Tensor parts = strategy_->grad_square_parts(ctx);
      ops::clip_grad_scale(ctx, parts, inv_scale, oc.grad_clip, g->clip);
      strategy_->step(ctx, lr, inv_scale);   // the kernel skips itself on a non-finite norm
      strategy_->release_gradients();
      g->loss_sums = std::move(loss_sums);
    });
  } catch (...) {
    adamw.set_device_step(nullptr, nullptr);
    adamw.set_steps(t0);
    throw;
  }
  // Eager steps (another shape's first) take their scalars from the host again; the capture's
  // step() counted a step that has not run (the replays count their own).
  adamw.set_device_step(nullptr, nullptr);
  adamw.set_steps(t0);
  graphed_ = std::move(g);
  ++graph_stats_.captures;
}

StepResult Trainer::graphed_step(const std::vector<std::int32_t>& tokens, std::int64_t T) {
  const double scale = scaler_.scale();
  if (graphed_ && (graphed_->T != T || graphed_->loss_scale != scale)) graphed_.reset();
  // The FP8 weights the step casts, made now where stale (the first step, weights replaced):
  // a captured forward reads their codes as they are (model/fp8_weight_casts.h).
  if (fp8_casts_ && !fp8_casts_->ready()) fp8_casts_->cast_now(env_.rt.ctx());
  if (!graphed_) {
    if (eager_T_ != T || eager_scale_ != scale) {
      // A key's first step runs eagerly: it makes the GEMM plans, the RoPE tables and the
      // allocator's cached blocks the capture then finds, so nothing in it waits for the device.
      eager_T_ = T;
      eager_scale_ = scale;
      ++graph_stats_.eager_steps;
      return eager_step(tokens, T);
    }
    capture_step(T);
  }
  ops::Runtime& rt = env_.rt;
  Context& ctx = rt.ctx();
  optim::AdamW& adamw = adamw_of(*strategy_);
  GraphedStep& g = *graphed_;
  StepResult r;
  // This step's tokens into the fixed buffers, and AdamW's scalars for step t + 1 (what the eager
  // step's begin_step() makes t) and this step's lr, queued before the replay.
  const int accum = static_cast<int>(g.inputs.size());
  const std::int64_t rows = local_rows_ / accum;
  for (int m = 0; m < accum; ++m) {
    const parallel::MicroBatch host = split_rows(tokens, T, m * rows, (m + 1) * rows);
    ops::copy(ctx, host.inputs, g.inputs[static_cast<std::size_t>(m)].inputs);
    ops::copy(ctx, host.targets, g.inputs[static_cast<std::size_t>(m)].targets);
  }
  const std::int64_t t0 = adamw.steps();
  r.lr = schedule_.at(step_);
  ops::adamw_upload_scalars(ctx, optim::adamw_hyper(env_.cfg.optim, t0 + 1, r.lr, 1.0), adamw_scalars_);
  auto t_start = rt.mark();
  g.graph->replay();
  auto t_end = rt.mark();
  ++graph_stats_.replays;
  // The norm (one read), then the loss (one read), as the eager step reads them.
  Tensor clip_h = Tensor::empty({ops::kClipSlots}, DType::f64, *ctx.host, "grad_clip");
  ops::copy(ctx, g.clip, clip_h);
  const double norm = clip_h.data_as<double>()[ops::kClipNorm];
  const bool finite = std::isfinite(norm);
  r.grad_norm = norm;
  r.loss_scale = scale;
  if (scaler_.update(!finite) && finite) {
    adamw.set_steps(t0 + 1);
  } else {
    r.skipped = true;   // (the kernel did nothing: the device saw the same norm)
  }
  r.loss = mean_loss(g.loss_sums, static_cast<double>(global_batch_ * T));
  // Only the whole step is timed: a graph has no marks between its phases.
  r.times.total_ms = rt.elapsed_ms(t_start, t_end);
  ++step_;
  return r;
}

}  // namespace lmscale::jobs
