#include "lmscale/jobs/trainer.h"

#include <cmath>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/ops/ops.h"
#include "lmscale/optim/grad_clip.h"
#include "lmscale/parallel/ddp.h"
#include "lmscale/parallel/fsdp.h"
#include "lmscale/parallel/gradient_sync.h"
#include "lmscale/parallel/tensor_parallel.h"
#include "lmscale/parallel/zero.h"
#include "lmscale/comm/communicator.h"
#include "lmscale/comm/mesh.h"

namespace lmscale::jobs {

namespace {
// Master weights, gradients and optimizer state are fp32 in every precision mode (DESIGN §2).
constexpr DType kMaster = DType::f32;
// Gradient buckets of one process: large, so the optimizer makes few launches (xl: ~32).
constexpr double kLazyBucketBytes = 256.0 * 1024 * 1024;
DType lowp_dtype(const Config& c) {
  if (c.precision.mode == "bf16") return DType::bf16;
  if (c.precision.mode == "fp16") return DType::f16;
  return DType::f32;
}
}  // namespace

Trainer::Trainer(JobEnv& env, std::int64_t global_batch, std::int64_t grad_accum, std::int64_t total_steps)
    : env_(env),
      dims_(model::ModelDims::from(env.cfg.model)),
      scaler_(env.cfg.precision.loss_scale_init, env.cfg.precision.loss_scale_window, env.cfg.precision.mode == "fp16"),
      schedule_{env.cfg.optim.lr, env.cfg.optim.min_lr, env.cfg.optim.warmup_steps,
                env.cfg.optim.cosine_steps > 0 ? env.cfg.optim.cosine_steps : total_steps},
      global_batch_(global_batch),
      grad_accum_(grad_accum),
      master_(kMaster),
      lowp_(lowp_dtype(env.cfg)) {
  Context& ctx = env.rt.ctx();
  const auto& pc = env.cfg.parallel;
  // Data-parallel group: the world, or with tensor parallelism the dp axis of the dp x tp mesh
  // (tp ranks adjacent: rank = dp_idx * tp + tp_idx; pp = 1).
  std::int64_t dp = env.world;
  int dp_rank = env.rank;
  comm::Communicator* dp_comm = env.comm.get();
  comm::Communicator* dp_host = env.host_comm.get();
  if (pc.tp > 1) {
    LMSCALE_CHECK(env.comm && env.host_comm, "tensor parallelism needs the world communicators");
    // Set before the split: the mesh's communicators inherit the compute stream.
    if (env.comm->device() == Device::cuda) env.comm->set_compute_stream(ctx.stream);
    comm::MeshShape shape;
    shape.tp = static_cast<int>(pc.tp);
    shape.dp = static_cast<int>(pc.dp);
    mesh_ = std::make_unique<comm::Mesh>(env.comm, shape);
    host_mesh_ = std::make_unique<comm::Mesh>(env.host_comm, shape);
    LMSCALE_CHECK(mesh_->shape().pp == 1, "tensor parallelism with pipeline stages is not built");
    tp_ = std::make_unique<parallel::TensorParallel>(mesh_->tp(), host_mesh_->tp(), pc.sequence_parallel);
    dp = mesh_->shape().dp;
    dp_rank = mesh_->coords().dp;
    dp_comm = &mesh_->dp();
    dp_host = &host_mesh_->dp();
    LMSCALE_CHECK(pc.zero != "fsdp" || dp == 1, "parallel.zero = fsdp with parallel.tp > 1 is not built");
  }
  LMSCALE_CHECK(global_batch % dp == 0, "batch_size {} not divisible by {} data-parallel ranks", global_batch, dp);
  local_rows_ = global_batch / dp;
  first_row_ = dp_rank * local_rows_;
  LMSCALE_CHECK(local_rows_ % grad_accum == 0, "local batch {} not divisible by grad_accum {}", local_rows_, grad_accum);
  // One process and ZeRO-2 keep gradients in per-bucket buffers that exist only from the backward
  // to the optimizer step (so they never coexist with the whole forward's activations); DDP and
  // the other ZeRO levels reduce one flat buffer.
  // FSDP keeps only shards (the store holds no flat buffers). With one data-parallel rank every
  // sharding mode is the plain single-process path.
  const bool fsdp = dp > 1 && pc.zero == "fsdp";
  const bool bucket_grads = dp == 1 || pc.zero == "zero2";
  using Buffers = model::ParameterStore::Buffers;
  params_ = std::make_unique<model::ParameterStore>(
      dims_, master_, lowp_, *ctx.allocator,
      fsdp ? Buffers::none : (bucket_grads ? Buffers::params_only : Buffers::params_and_grads),
      tp_ ? tp_->split() : model::TensorSplit{});
  params_->init(env.cfg.run.seed, ctx);
  model_ = std::make_unique<model::TransformerLM>(dims_, *params_);
  model_->set_recompute(
      model::RecomputePolicy::from(env.cfg.train.activation_checkpointing, env.cfg.train.checkpoint_k));
  if (dp > 1) {
    LMSCALE_CHECK(dp_comm && dp_host, "data parallelism needs the world communicators");
    if (dp_comm->device() == Device::cuda) dp_comm->set_compute_stream(ctx.stream);
    const parallel::DdpMode ddp = parallel::parse_ddp_mode(pc.ddp == "none" ? "flat" : pc.ddp);
    if (fsdp) {
      auto f = std::make_unique<parallel::FullyShardedDataParallel>(*params_, *dp_comm, *dp_host, env.cfg.optim,
                                                                    parallel::FsdpOptions::from(pc),
                                                                    env.cfg.run.seed, env.rt);
      fsdp_ = f.get();
      sharded_ = std::move(f);
      sync_ = &sharded_->sync();
    } else if (pc.zero != "none") {
      auto zero = std::make_unique<parallel::ZeroOptimizer>(parallel::parse_zero_mode(pc.zero), *dp_comm, *dp_host,
                                                            env.cfg.optim);
      zero->add_group({params_->flat_params(), params_->has_flat_grads() ? params_->flat_grads() : Tensor(),
                       params_->has_lowp() ? &params_->flat_lowp() : nullptr},
                      ctx);
      zero->make_sync(ddp, *params_, pc.bucket_mb, ctx);
      sharded_ = std::move(zero);
      sync_ = &sharded_->sync();
    } else {
      auto ddp_sync = std::make_unique<parallel::DataParallel>(ddp, *dp_comm, *dp_host, *params_, pc.bucket_mb);
      ddp_sync->broadcast_parameters(ctx);
      owned_sync_ = std::move(ddp_sync);
    }
  } else {
    owned_sync_ = std::make_unique<parallel::GradientSync>();
    lazy_ = std::make_unique<model::LazyGradients>(*params_, kLazyBucketBytes, *ctx.allocator);
  }
  if (!sync_) sync_ = owned_sync_.get();
  if (!sharded_) adamw_ = std::make_unique<optim::AdamW>(env.cfg.optim, params_->numel(), master_, ctx);
  memory_points_["after_init"] = env.rt.allocator().tracker().by_tag();
}

Trainer::~Trainer() = default;

std::pair<Tensor, Tensor> Trainer::upload(const std::vector<std::int32_t>& tokens, std::int64_t T, std::int64_t r0,
                                          std::int64_t r1) {
  Context& ctx = env_.rt.ctx();
  const std::int64_t rows = r1 - r0;
  // Split [rows, T+1] sequences into inputs [rows, T] and targets [rows, T] on the host.
  Tensor in_h = Tensor::empty({rows, T}, DType::i32, *ctx.host, "batch");
  Tensor tg_h = Tensor::empty({rows, T}, DType::i32, *ctx.host, "batch");
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t* seq = tokens.data() + (r0 + r) * (T + 1);
    std::copy(seq, seq + T, in_h.data_as<std::int32_t>() + r * T);
    std::copy(seq + 1, seq + T + 1, tg_h.data_as<std::int32_t>() + r * T);
  }
  if (ctx.device == Device::cpu) return {in_h, tg_h};
  Tensor in_d = Tensor::empty({rows, T}, DType::i32, *ctx.allocator, "batch");
  Tensor tg_d = Tensor::empty({rows, T}, DType::i32, *ctx.allocator, "batch");
  ops::copy(ctx, in_h, in_d);
  ops::copy(ctx, tg_h, tg_d);
  return {in_d, tg_d};
}

double Trainer::reduce_loss(Tensor& loss_sum_device, double tokens_global) {
  Context& ctx = env_.rt.ctx();
  Tensor host = Tensor::empty({1}, loss_sum_device.dtype(), *ctx.host, "loss");
  ops::copy(ctx, loss_sum_device, host);
  const double local = host.dtype() == DType::f64 ? host.data_as<double>()[0] : host.data_as<float>()[0];
  return sync_->sum_scalar(local) / tokens_global;
}

void Trainer::accumulate_micro_batches(const std::vector<std::int32_t>& tokens, std::int64_t T, StepResult& r,
                                       std::vector<Tensor>& loss_sums) {
  Context& ctx = env_.rt.ctx();
  ops::Runtime& rt = env_.rt;
  const std::int64_t micro = local_rows_ / grad_accum_;
  const double grad_scale = scaler_.scale() / static_cast<double>(global_batch_ * T);
  for (std::int64_t m = 0; m < grad_accum_; ++m) {
    auto [in, tg] = upload(tokens, T, m * micro, (m + 1) * micro);
    auto t0 = rt.mark();
    auto act = model_->forward(ctx, in, tg, true, grad_scale, with_tp(sync_->forward_hooks(true)));
    auto t1 = rt.mark();
    // The first micro-batch overwrites the gradients, later ones add to them.
    model_->backward(ctx, *act, with_tp(sync_->hooks(static_cast<int>(m), static_cast<int>(grad_accum_))), m > 0);
    auto t2 = rt.mark();
    loss_sums.push_back(act->loss_sum);
    r.times.forward_ms += rt.elapsed_ms(t0, t1);
    r.times.backward_ms += rt.elapsed_ms(t1, t2);
    if (m == 0) rt.allocator().tracker().mark_phase("forward_backward");
  }
}

StepResult Trainer::forward_backward(const std::vector<std::int32_t>& tokens, std::int64_t T) {
  StepResult r;
  std::vector<Tensor> loss_sums;
  accumulate_micro_batches(tokens, T, r, loss_sums);
  double loss = 0;
  for (auto& l : loss_sums) loss += reduce_loss(l, static_cast<double>(global_batch_ * T));
  r.loss = loss;   // the loss itself is never scaled, only the gradient seed is
  r.times.total_ms = r.times.forward_ms + r.times.backward_ms;
  release_gradients();
  return r;
}

void Trainer::release_gradients() {
  if (lazy_) lazy_->release();
}

StepResult Trainer::train_step(const std::vector<std::int32_t>& tokens, std::int64_t T) {
  NvtxRange range("train_step");
  ops::Runtime& rt = env_.rt;
  Context& ctx = rt.ctx();
  StepResult r;
  auto t_start = rt.mark();
  std::vector<Tensor> loss_sums;
  accumulate_micro_batches(tokens, T, r, loss_sums);

  auto c0 = rt.mark();
  {
    NvtxRange n("gradient_sync");
    sync_->finish(ctx);
  }
  auto c1 = rt.mark();
  r.times.comm_ms = rt.elapsed_ms(c0, c1);

  NvtxRange n("optimizer");
  memory_points_["before_optimizer"] = rt.allocator().tracker().by_tag();
  auto o0 = rt.mark();
  // Gradients hold loss_scale * d(mean loss)/dw; clipping works on the unscaled norm. After DDP
  // every rank holds the summed gradients; with ZeRO each holds its range (summed over ranks).
  const double inv_scale = 1.0 / scaler_.scale();
  const double norm = std::sqrt(global_grad_sum_squares(ctx)) * inv_scale;
  const bool finite = std::isfinite(norm);
  r.grad_norm = norm;
  r.loss_scale = scaler_.scale();
  r.lr = schedule_.at(step_);
  if (scaler_.update(!finite) && finite) {
    const double clip = optim::clip_factor(norm, env_.cfg.optim.grad_clip);
    if (sharded_) {
      sharded_->step(ctx, r.lr, inv_scale * clip);
    } else if (lazy_) {
      adamw_->begin_step();
      for (int b = 0; b < static_cast<int>(lazy_->buckets().size()); ++b) {
        const auto& k = lazy_->buckets()[static_cast<std::size_t>(b)];
        Tensor p = params_->flat_params().flat_range(k.offset, k.numel);
        Tensor lowp;
        if (params_->has_lowp()) lowp = params_->flat_lowp().flat_range(k.offset, k.numel);
        adamw_->step_range(ctx, p, lazy_->bucket(b), params_->has_lowp() ? &lowp : nullptr, k.offset, r.lr,
                           inv_scale * clip);
      }
    } else {
      Tensor* lowp = params_->has_lowp() ? &params_->flat_lowp() : nullptr;
      adamw_->step(ctx, params_->flat_params(), params_->flat_grads(), lowp, r.lr, inv_scale * clip);
    }
  } else {
    r.skipped = true;
  }
  release_gradients();
  auto o1 = rt.mark();
  r.times.optimizer_ms = rt.elapsed_ms(o0, o1);
  rt.allocator().tracker().mark_phase("optimizer");
  memory_points_["after_optimizer"] = rt.allocator().tracker().by_tag();
  double loss = 0;
  for (auto& l : loss_sums) loss += reduce_loss(l, static_cast<double>(global_batch_ * T));
  r.loss = loss;
  r.times.total_ms = rt.elapsed_ms(t_start, o1);
  ++step_;
  return r;
}

double Trainer::forward_loss(const std::vector<std::int32_t>& tokens, std::int64_t T, StepTimes* times) {
  ops::Runtime& rt = env_.rt;
  Context& ctx = rt.ctx();
  const std::int64_t rows = static_cast<std::int64_t>(tokens.size()) / (T + 1);
  auto [in, tg] = upload(tokens, T, 0, rows);
  auto t0 = rt.mark();
  auto act = model_->forward(ctx, in, tg, false, 1.0, with_tp(sync_->forward_hooks(false)));
  auto t1 = rt.mark();
  if (times) times->forward_ms = rt.elapsed_ms(t0, t1);
  rt.allocator().tracker().mark_phase("forward");
  return reduce_loss(act->loss_sum, static_cast<double>(sync_->sum_scalar(static_cast<double>(rows)) * T));
}

std::vector<float> Trainer::full_parameters() {
  Context& ctx = env_.rt.ctx();
  if (fsdp_) return fsdp_->full_parameters(ctx);
  LMSCALE_CHECK(params_->master_dtype() == DType::f32, "full_parameters: fp32 master weights only");
  std::vector<float> h(static_cast<std::size_t>(params_->numel()));
  Tensor dst = Tensor::view(h.data(), {params_->numel()}, DType::f32, Device::cpu);
  ops::copy(ctx, params_->flat_params(), dst);
  return to_full_layout(h);
}

void Trainer::set_parameters(const std::vector<float>& full) {
  Context& ctx = env_.rt.ctx();
  if (fsdp_) return fsdp_->set_parameters(ctx, full);
  const std::vector<float> flat = to_local_layout(full);
  LMSCALE_CHECK(static_cast<std::int64_t>(flat.size()) == params_->numel(), "set_parameters: {} values for {}",
                flat.size(), params_->numel());
  Tensor src = Tensor::view(const_cast<float*>(flat.data()), {params_->numel()}, DType::f32, Device::cpu);
  ops::copy(ctx, src, params_->flat_params());
  params_->refresh_lowp(ctx);
}

std::vector<float> Trainer::to_full_layout(const std::vector<float>& local) {
  return tp_ ? tp_->gather_full(dims_, local) : local;
}

std::vector<float> Trainer::to_local_layout(const std::vector<float>& full) const {
  return tp_ ? tp_->slice_local(dims_, full) : full;
}

model::ParallelContext Trainer::with_tp(model::ParallelContext pc) const {
  if (tp_) pc.tp = tp_->callbacks();
  return pc;
}

double Trainer::global_grad_sum_squares(Context& ctx) {
  // Every strategy's sum of squares over this rank's gradients (summed over data-parallel ranks
  // where they hold shards).
  double sq = 0;
  if (sharded_) {
    sq = sharded_->grad_sum_squares(ctx);
  } else if (lazy_) {
    std::vector<Tensor> parts;
    for (int b = 0; b < static_cast<int>(lazy_->buckets().size()); ++b) parts.push_back(lazy_->bucket(b));
    sq = optim::sum_of_squares(ctx, parts);
  } else {
    sq = optim::sum_of_squares(ctx, params_->flat_grads());
  }
  if (!tp_) return sq;
  // Tensor parallel: the sliced parameters' squares add over the tp ranks; the replicated norm
  // weights (identical on every tp rank) count once.
  double replicated = 0;
  if (sharded_) {
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    for (const auto& p : params_->infos())
      if (p.split_dim < 0) ranges.emplace_back(p.offset, p.numel);
    replicated = sharded_->grad_sum_squares_in(ctx, ranges);
  } else {
    std::vector<Tensor> parts;
    for (int i = 0; i < params_->size(); ++i)
      if (params_->infos()[static_cast<std::size_t>(i)].split_dim < 0) parts.push_back(params_->grad(i));
    replicated = optim::sum_of_squares(ctx, parts);
  }
  return tp_->global_sum_squares(sq, replicated);
}

}  // namespace lmscale::jobs
