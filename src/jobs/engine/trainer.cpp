#include "lmscale/jobs/engine/trainer.h"

#include <algorithm>
#include <cmath>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/ops/ops.h"
#include "lmscale/optim/grad_clip.h"
#include "lmscale/parallel/ddp.h"
#include "lmscale/parallel/fsdp.h"
#include "lmscale/parallel/gradient_sync.h"
#include "lmscale/parallel/optimizer_segments.h"
#include "lmscale/parallel/spec.h"
#include "lmscale/parallel/tensor_parallel.h"
#include "lmscale/parallel/zero.h"
#include "lmscale/comm/communicator.h"
#include "lmscale/comm/mesh.h"
#include "lmscale/model/stage.h"
#include "lmscale/parallel/pipeline.h"

namespace lmscale::jobs {

namespace {
// Master weights, gradients and optimizer state are fp32 in every precision mode (docs/architecture.md §2).
constexpr DType kMaster = DType::f32;
// Linear LR scaling (Goyal et al. 2017): lr x global batch / reference batch, global batch = the
// sequences of one optimizer step over all data-parallel ranks and micro-batches.
double linear_lr_scale(const OptimConfig& o, std::int64_t global_batch) {
  return o.reference_batch > 0 ? static_cast<double>(global_batch) / static_cast<double>(o.reference_batch) : 1.0;
}
DType lowp_dtype(const Config& c) {
  switch (c.precision.mode) {
    case PrecisionMode::bf16: return DType::bf16;
    case PrecisionMode::fp16: return DType::f16;
    case PrecisionMode::fp32: break;
  }
  return DType::f32;
}
}  // namespace

Trainer::Trainer(JobEnv& env, std::int64_t global_batch, std::int64_t grad_accum, std::int64_t total_steps)
    : env_(env),
      dims_(model::ModelDims::from(env.cfg.model)),
      scaler_(env.cfg.precision.loss_scale_init, env.cfg.precision.loss_scale_window, env.cfg.precision.mode == PrecisionMode::fp16),
      schedule_{env.cfg.optim.lr * linear_lr_scale(env.cfg.optim, global_batch),
                env.cfg.optim.min_lr * linear_lr_scale(env.cfg.optim, global_batch), env.cfg.optim.warmup_steps,
                env.cfg.optim.cosine_steps > 0 ? env.cfg.optim.cosine_steps : total_steps},
      global_batch_(global_batch),
      grad_accum_(grad_accum),
      lr_scale_(linear_lr_scale(env.cfg.optim, global_batch)),
      master_(kMaster),
      lowp_(lowp_dtype(env.cfg)) {
  Context& ctx = env.rt.ctx();
  const auto& pc = env.cfg.parallel;
  // Data-parallel group: the world, or the dp axis of the dp x tp x pp mesh (comm/mesh.h; tp
  // ranks adjacent: rank = (pp_idx*dp + dp_idx)*tp + tp_idx). The ranks of a tp group take the
  // same rows and each holds its slices of the parameters; every stage of a dp replica reads the
  // same rows, each stage's dp ranks split the batch as without pp. tp x pp: each stage's blocks
  // are tensor-parallel over its tp group, and the pp group links the same tp rank of every stage.
  const int pp = static_cast<int>(pc.pp);
  std::vector<model::StageUnits> chunks{model::StageUnits::all()};
  dp_size_ = env.world;
  dp_rank_ = env.rank;
  comm::Communicator* dp_comm = env.comm.get();
  comm::Communicator* dp_host = env.host_comm.get();
  if (pc.tp > 1 || pp > 1) {
    LMSCALE_CHECK(env.comm && env.host_comm, "tensor and pipeline parallelism need the world communicators");
    // Set before the split: the mesh's communicators inherit the compute stream.
    if (env.comm->device() == Device::cuda) env.comm->set_compute_stream(ctx.stream);
    comm::MeshShape shape;
    shape.tp = static_cast<int>(pc.tp);
    shape.pp = pp;
    shape.dp = static_cast<int>(pc.dp);
    mesh_ = std::make_unique<comm::Mesh>(env.comm, shape);
    host_mesh_ = std::make_unique<comm::Mesh>(env.host_comm, shape);
    if (pc.tp > 1)
      tp_ = std::make_unique<parallel::TensorParallel>(mesh_->tp(), host_mesh_->tp(), pc.sequence_parallel);
    dp_size_ = mesh_->shape().dp;
    dp_rank_ = mesh_->coords().dp;
    dp_comm = &mesh_->dp();
    dp_host = &host_mesh_->dp();
    if (pp > 1) {
      // This rank's stage, or its virtual_stages chunks under the interleaved schedule.
      const int V = pc.schedule == PipelineSchedule::interleaved ? static_cast<int>(pc.virtual_stages) : 1;
      chunks = model::pipeline_chunks(dims_, pp, V, mesh_->coords().pp, pc.stage_layers);
    }
  }
  const std::int64_t dp = dp_size_;
  LMSCALE_CHECK(global_batch % dp == 0, "batch_size {} not divisible by {} data-parallel ranks", global_batch, dp);
  local_rows_ = global_batch / dp;
  first_row_ = dp_rank_ * local_rows_;
  LMSCALE_CHECK(local_rows_ % grad_accum == 0, "local batch {} not divisible by grad_accum {}", local_rows_, grad_accum);
  // Where gradients live (parallel::Spec::grad_storage): the data-parallel group this trainer
  // built decides the degree (a one-process reference run inside a larger world has dp 1).
  parallel::Spec spec = parallel::Spec::resolve(pc, env.world);
  spec.dp = static_cast<int>(dp);
  const bool fsdp = spec.fsdp();
  LMSCALE_CHECK(!(fsdp && pp > 1), "parallel.zero = fsdp with parallel.pp > 1 is not built");
  using Buffers = model::ParameterStore::Buffers;
  const parallel::GradStorage storage = spec.grad_storage();
  params_ = std::make_unique<model::ParameterStore>(
      dims_, master_, lowp_, *ctx.allocator,
      storage == parallel::GradStorage::shards         ? Buffers::none
      : storage == parallel::GradStorage::lazy_buckets ? Buffers::params_only
                                                       : Buffers::params_and_grads,
      tp_ ? tp_->split() : model::TensorSplit{}, chunks);
  params_->init(env.cfg.run.seed, ctx);
  // One model per chunk over the one store (a single one without the interleaved schedule).
  for (const auto& u : chunks) chunk_models_.push_back(std::make_unique<model::TransformerLM>(dims_, *params_, u));
  model_ = chunk_models_.front().get();
  for (auto& m : chunk_models_)
    m->set_recompute(model::RecomputePolicy::from(env.cfg.train));
  if (pp > 1) {
    if (env.comm->device() == Device::cuda) mesh_->pp().set_compute_stream(ctx.stream);
    std::vector<model::TransformerLM*> models;
    for (auto& m : chunk_models_) models.push_back(m.get());
    pipeline_ = std::make_unique<parallel::PipelineParallel>(models, mesh_->pp(), env.rt,
                                                             pc.schedule,
                                                             tp_ ? tp_->callbacks() : model::TensorParallelComm{});
  }
  if (dp > 1) {
    LMSCALE_CHECK(dp_comm && dp_host, "data parallelism needs the world communicators");
    if (dp_comm->device() == Device::cuda) dp_comm->set_compute_stream(ctx.stream);
    const parallel::DdpMode ddp = parallel::ddp_mode_of(pc.ddp);
    // parallel.grad_reduce_dtype (fp64 test runs keep their own dtype).
    const std::optional<DType> grad_reduce =
        pc.grad_reduce_dtype == GradReduceDtype::bf16 ? std::optional<DType>(DType::bf16) : std::nullopt;
    if (fsdp) {
      auto f = std::make_unique<parallel::FullyShardedDataParallel>(*params_, *dp_comm, *dp_host, env.cfg.optim,
                                                                    parallel::FsdpOptions::from(pc),
                                                                    env.cfg.run.seed, env.rt);
      fsdp_ = f.get();
      sharded_ = std::move(f);
      sync_ = &sharded_->sync();
    } else if (pc.zero != ZeroLevel::none) {
      auto zero = std::make_unique<parallel::ZeroOptimizer>(parallel::zero_mode_of(pc.zero), *dp_comm, *dp_host,
                                                            env.cfg.optim);
      zero->add_group({params_->flat_params(), params_->has_flat_grads() ? params_->flat_grads() : Tensor(),
                       params_->has_lowp() ? &params_->flat_lowp() : nullptr,
                       parallel::param_segments(params_->infos(), 0, params_->numel()), params_->size(),
                       params_->master_read_ranges()},
                      ctx);
      zero->make_sync(ddp, *params_, pc.bucket_mb, ctx, grad_reduce, pc.grad_exchange == GradExchange::copy_engine);
      sharded_ = std::move(zero);
      sync_ = &sharded_->sync();
    } else {
      auto ddp_sync = std::make_unique<parallel::DataParallel>(ddp, *dp_comm, *dp_host, *params_, pc.bucket_mb);
      if (grad_reduce) ddp_sync->set_reduce_dtype(*grad_reduce, ctx);
      if (pc.grad_exchange == GradExchange::copy_engine) ddp_sync->use_copy_engine(env.rt);
      ddp_sync->broadcast_parameters(ctx);
      owned_sync_ = std::move(ddp_sync);
    }
  } else {
    owned_sync_ = std::make_unique<parallel::GradientSync>();
    lazy_ = std::make_unique<parallel::LazyGradients>(*params_, parallel::kOneProcessBucketBytes, *ctx.allocator);
  }
  if (!sync_) sync_ = owned_sync_.get();
  if (!sharded_) {
    optimizer_ = optim::make_optimizer(env.cfg.optim, params_->numel(), master_, ctx, params_->size(),
                                       parallel::param_segments(params_->infos(), 0, params_->numel()));
  } else if (tp_) {
    // ZeRO over the dp axis of a dp x tp mesh: the shards' norm sums are summed over dp by the
    // strategy, then over the tp slices here.
    sharded_->set_norm_reducer([this](std::vector<double>& sums) {
      tp_->sum_param_norms(params_->infos(), optim::Optimizer::kNormSlots, sums);
    });
  }
  overlap_optimizer_ = pc.overlap_optimizer && ctx.device == Device::cuda && optimizer_ && !tp_ && !pipeline_;
  carve_forward_ = fsdp_ != nullptr || pipeline_ != nullptr;
  carve_backward_ = dp > 1 || pipeline_ != nullptr;
  // The update's segments: the lazy gradient buckets (one process), or the same 256 MiB split of
  // the flat buffer (DDP). Units: 0 the embedding, l+1 block l, L+1 the final norm and the head.
  const int L = static_cast<int>(dims_.layers);
  auto with_units = [&](const std::vector<parallel::GradBucket>& buckets) {
    std::vector<UpdateSegment> out;
    for (const auto& k : buckets) {
      int first = L + 1;
      for (int i = k.first; i <= k.last; ++i) {
        const auto& p = params_->infos()[static_cast<std::size_t>(i)];
        const int u = p.layer >= 0 ? p.layer + 1 : (p.kind == model::ParamInfo::Kind::embedding ? 0 : L + 1);
        first = std::min(first, u);
      }
      out.push_back({k, first});
    }
    return out;
  };
  update_segments_ = with_units(lazy_ ? lazy_->buckets() : parallel::gradient_buckets(params_->infos(), parallel::kOneProcessBucketBytes, 4));
  // parallel.overlap_param_gather: the zero1/zero2 parameter all-gather in segments of
  // parallel.bucket_mb (of fp32 master bytes), in forward order (ascending first unit; the flat
  // buffer holds the units in backward order).
  if (auto* zero = dynamic_cast<parallel::ZeroOptimizer*>(sharded_.get());
      zero && pc.overlap_param_gather && pc.zero != ZeroLevel::zero1_broadcast && !tp_ && !pipeline_) {
    gather_segments_ = with_units(parallel::gradient_buckets(params_->infos(), pc.bucket_mb * 1024.0 * 1024.0, 4));
    std::reverse(gather_segments_.begin(), gather_segments_.end());
    std::stable_sort(gather_segments_.begin(), gather_segments_.end(),
                     [](const UpdateSegment& a, const UpdateSegment& b) { return a.first_unit < b.first_unit; });
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    for (const auto& g : gather_segments_) ranges.emplace_back(g.range.offset, g.range.numel);
    zero->defer_gathers(std::move(ranges));
    zero_ = zero;
  }
  memory_points_["after_init"] = env.rt.allocator().tracker().by_tag();
}

Trainer::~Trainer() {
  // No waiting for a pending update's collectives while an exception unwinds (core/error.h): the
  // peers may never complete them; the failing rank aborts the job. One rank has no peers to wait
  // for, and a sweep that catches an OutOfMemory goes on: it settles as usual.
  if (unwinding() && env_.world > 1) return;
  // The side stream may still read the parameters, state and gradients freed below.
  settle_optimizer();
  if (overlap_optimizer_) env_.rt.synchronize();
}

void Trainer::wait_for_update(int unit) {
  ops::Runtime& rt = env_.rt;
  while (next_pending_ < pending_updates_.size() && pending_updates_[next_pending_].first_unit <= unit) {
    PendingUpdate& p = pending_updates_[next_pending_++];
    if (p.gathered.valid())
      p.gathered.wait();
    else
      rt.wait(rt.ctx(), p.done);
    // Ordered after the wait on the compute stream, so the allocator may hand the bytes to the
    // forward's next allocation.
    if (lazy_ && p.bucket >= 0) lazy_->release(p.bucket);
  }
  if (next_pending_ == pending_updates_.size()) {
    pending_updates_.clear();
    next_pending_ = 0;
  }
}

model::ParallelContext Trainer::with_update_waits(model::ParallelContext pc) {
  if (pending_updates_.empty()) return pc;
  pc.before_forward = [this, inner = std::move(pc.before_forward)](int u) {
    wait_for_update(u);
    if (inner) inner(u);
  };
  return pc;
}

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
  return sum_over_stages(sync_->sum_scalar(local)) / tokens_global;
}

double Trainer::sum_over_stages(double x) {
  if (!pipeline_) return x;   // (host_mesh_ alone may be the dp x tp mesh)
  double y = 0;
  host_mesh_->pp().all_reduce(&x, &y, 1, DType::f64, comm::ReduceOp::sum).wait();
  return y;
}

void Trainer::accumulate_micro_batches(const std::vector<std::int32_t>& tokens, std::int64_t T, StepResult& r,
                                       std::vector<Tensor>& loss_sums) {
  Context& ctx = env_.rt.ctx();
  ops::Runtime& rt = env_.rt;
  const std::int64_t micro = local_rows_ / grad_accum_;
  const double grad_scale = scaler_.scale() / static_cast<double>(global_batch_ * T);
  if (pipeline_) {
    // The rank's rows in parallel.microbatches microbatches, run through the stages by the
    // schedule (grad_accum is 1 with pp: the deck check refuses anything else).
    const std::int64_t M = env_.cfg.parallel.microbatches, rows = local_rows_ / M;
    std::vector<Tensor> ins, tgs;
    for (std::int64_t m = 0; m < M; ++m) {
      auto [in, tg] = upload(tokens, T, m * rows, (m + 1) * rows);
      ins.push_back(in);
      tgs.push_back(tg);
    }
    std::vector<Tensor> sums;
    pipe_begin_ = rt.mark();
    ops::Runtime::GemmCarveout carve(rt, carve_forward_);
    pipeline_->run(ins, tgs, T, grad_scale, false, *sync_, 0, static_cast<int>(M), sums);
    pipe_end_ = rt.mark();   // the times are read after the step (no host sync here)
    // The last stage holds the loss sums; the others report 0 (summed over stages later).
    // (as many as the last stage's, so every rank makes the same reductions).
    while (static_cast<std::int64_t>(sums.size()) < M) {
      Tensor zero = Tensor::empty({1}, DType::f32, *ctx.allocator, "loss");
      ops::fill(ctx, zero, 0.0);
      sums.push_back(zero);
    }
    for (auto& l : sums) loss_sums.push_back(l);
    rt.allocator().tracker().mark_phase("forward_backward");
    return;
  }
  for (std::int64_t m = 0; m < grad_accum_; ++m) {
    auto [in, tg] = upload(tokens, T, m * micro, (m + 1) * micro);
    // The first micro-batch overwrites the gradients, later ones add to them. The forward runs the
    // head unit's backward (fused LM head + cross-entropy), so it gets the micro-batch's backward
    // hooks as well as the forward ones (taken in this order: FSDP's forward hooks close a step
    // left open, its backward hooks open this one).
    const bool accumulate = m > 0;
    model::ParallelContext pc = with_tp(sync_->forward_hooks(true));
    const model::ParallelContext bpc = sync_->hooks(static_cast<int>(m), static_cast<int>(grad_accum_));
    pc.on_grad_ready = bpc.on_grad_ready;
    pc.before_backward = bpc.before_backward;
    pc.after_backward = bpc.after_backward;
    auto t0 = rt.mark();
    std::unique_ptr<model::Activations> act;
    {
      ops::Runtime::GemmCarveout carve(rt, carve_forward_);
      act = model_->forward(ctx, in, tg, true, grad_scale, with_update_waits(pc), accumulate);
    }
    settle_optimizer();   // (the forward waited per unit; this only drops an empty queue)
    auto t1 = rt.mark();
    {
      ops::Runtime::GemmCarveout carve(rt, carve_backward_);
      model_->backward(ctx, *act, pc, accumulate);
    }
    auto t2 = rt.mark();
    loss_sums.push_back(act->loss_sum);
    r.times.forward_ms += rt.elapsed_ms(t0, t1);
    r.times.backward_ms += rt.elapsed_ms(t1, t2);
    if (m == 0) rt.allocator().tracker().mark_phase("forward_backward");
  }
}

StepResult Trainer::forward_backward(const std::vector<std::int32_t>& tokens, std::int64_t T) {
  settle_optimizer();
  StepResult r;
  std::vector<Tensor> loss_sums;
  accumulate_micro_batches(tokens, T, r, loss_sums);
  // The gradient reduction belongs to the backward (as in torch DDP): waited here, so no
  // collective is left in flight and ZeRO-2's buckets and the bf16 copies are released.
  finish_gradient_sync(r);
  double loss = 0;
  for (auto& l : loss_sums) loss += reduce_loss(l, static_cast<double>(global_batch_ * T));
  r.loss = loss;   // the loss itself is never scaled, only the gradient seed is
  pipeline_times(r);
  r.times.total_ms = r.times.forward_ms + r.times.backward_ms + r.times.comm_ms;
  release_gradients();
  return r;
}

void Trainer::finish_gradient_sync(StepResult& r) {
  ops::Runtime& rt = env_.rt;
  auto c0 = rt.mark();
  {
    NvtxRange n("gradient_sync");
    sync_->finish(rt.ctx());
  }
  r.times.comm_ms = rt.elapsed_ms(c0, rt.mark());
}

void Trainer::pipeline_times(StepResult& r) {
  if (!pipeline_) return;
  ops::Runtime& rt = env_.rt;
  pipeline_->finish_timing();
  // Forwards and backwards interleave: forward_ms is the stage's forward busy time, backward_ms
  // the rest of its pipeline (backward busy time, transfers and the bubble).
  const auto& st = pipeline_->stats();
  r.times.forward_ms = st.busy_forward_ms;
  r.times.backward_ms = rt.elapsed_ms(pipe_begin_, pipe_end_) - st.busy_forward_ms;
}

void Trainer::release_gradients() {
  if (lazy_) lazy_->release();
}

StepResult Trainer::train_step(const std::vector<std::int32_t>& tokens, std::int64_t T) {
  NvtxRange range("train_step");
  faults_.at_step_start(env_.rank, step_);   // test-only: one rank hangs here
  ops::Runtime& rt = env_.rt;
  Context& ctx = rt.ctx();
  StepResult r;
  auto t_start = rt.mark();
  std::vector<Tensor> loss_sums;
  accumulate_micro_batches(tokens, T, r, loss_sums);

  finish_gradient_sync(r);

  NvtxRange n("optimizer");
  memory_points_["before_optimizer"] = rt.allocator().tracker().by_tag();
  auto o0 = rt.mark();
  // Gradients hold loss_scale * d(mean loss)/dw; clipping works on the unscaled norm. After DDP
  // every rank holds the summed gradients; with ZeRO each holds its range (summed over ranks).
  const double inv_scale = 1.0 / scaler_.scale();
  // Pipeline: each stage holds its own parameters' gradients (squares add over the stages).
  const double norm = std::sqrt(sum_over_stages(global_grad_sum_squares(ctx))) * inv_scale;
  const bool finite = std::isfinite(norm);
  r.grad_norm = norm;
  r.loss_scale = scaler_.scale();
  r.lr = schedule_.at(step_);
  if (scaler_.update(!finite) && finite) {
    const double clip = optim::clip_factor(norm, env_.cfg.optim.grad_clip);
    if (sharded_) {
      sharded_->step(ctx, r.lr, inv_scale * clip);
      if (zero_) {   // the next forward waits for each segment's gather before its first unit
        std::vector<comm::Work> w = zero_->take_gathers();
        LMSCALE_CHECK(w.size() == gather_segments_.size(), "{} deferred gathers for {} segments", w.size(),
                      gather_segments_.size());
        for (std::size_t j = 0; j < w.size(); ++j)
          pending_updates_.push_back({-1, gather_segments_[j].first_unit, {}, std::move(w[j])});
      }
    } else {
      step_unsharded(ctx, r.lr, inv_scale * clip);
    }
  } else {
    r.skipped = true;
  }
  if (pending_updates_.empty()) release_gradients();   // else freed bucket by bucket by the next forward
  auto o1 = rt.mark();
  r.times.optimizer_ms = rt.elapsed_ms(o0, o1);
  rt.allocator().tracker().mark_phase("optimizer");
  memory_points_["after_optimizer"] = rt.allocator().tracker().by_tag();
  double loss = 0;
  for (auto& l : loss_sums) loss += reduce_loss(l, static_cast<double>(global_batch_ * T));
  r.loss = loss;
  r.times.total_ms = rt.elapsed_ms(t_start, o1);
  pipeline_times(r);
  ++step_;
  return r;
}

void Trainer::step_unsharded(Context& ctx, double lr, double grad_scale) {
  optim::Optimizer& opt = *optimizer_;
  ops::Runtime& rt = env_.rt;
  // The ranges this rank steps: the update segments (the lazy gradient buckets of one process, or
  // the 256 MiB split of DDP's flat buffer when the update is overlapped), else the whole flat
  // buffer (DDP, tensor and pipeline parallelism). Offsets are flat-buffer elements.
  struct Range {
    Tensor params, grads, lowp;
    std::int64_t offset;
    int segment;   // index in update_segments_, or -1 for the whole buffer
  };
  std::vector<Range> ranges;
  if (lazy_ || overlap_optimizer_) {
    for (int b = 0; b < static_cast<int>(update_segments_.size()); ++b) {
      const auto& k = update_segments_[static_cast<std::size_t>(b)].range;
      Tensor lowp;
      if (params_->has_lowp()) lowp = params_->flat_lowp().flat_range(k.offset, k.numel);
      Tensor g = lazy_ ? lazy_->bucket(b) : params_->flat_grads().flat_range(k.offset, k.numel);
      ranges.push_back({params_->flat_params().flat_range(k.offset, k.numel), g, lowp, k.offset, b});
    }
  } else {
    ranges.push_back({params_->flat_params(), params_->flat_grads(),
                      params_->has_lowp() ? params_->flat_lowp() : Tensor(), 0, -1});
  }
  opt.begin_step();
  if (opt.layerwise()) {
    // Whole parameters on this rank (DDP replicas are identical, pipeline stages disjoint), except
    // tensor-parallel slices: their partial sums are added over the tp group. On the compute
    // stream, before an overlapped update starts.
    std::vector<double> sums(opt.norm_slots(), 0.0);
    for (auto& g : ranges) opt.accumulate_norms(ctx, g.params, g.grads, g.offset, grad_scale, sums);
    if (tp_) tp_->sum_param_norms(params_->infos(), optim::Optimizer::kNormSlots, sums);
    opt.set_norms(sums);
  }
  // Overlapped: on the side stream, after everything the compute stream has queued (the backward,
  // the gradient sync's waits and the norm), segments in forward order (the last holds the
  // embedding), each marked so the next forward waits only for the units it reads.
  Context& octx = overlap_optimizer_ ? rt.side_ctx() : ctx;
  if (overlap_optimizer_) rt.wait(octx, rt.mark());
  if (lazy_ && !overlap_optimizer_) {
    // One process, not overlapped: the buckets' gradients as pieces of the one flat range, so
    // AdamW updates them in one pass (33 launches of xl cost 0.6 ms more than one).
    std::vector<ops::GradPiece> pieces;
    for (const auto& g : ranges) pieces.push_back({g.offset, g.grads});
    std::sort(pieces.begin(), pieces.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
    Tensor params = params_->flat_params();
    Tensor lowp = params_->has_lowp() ? params_->flat_lowp() : Tensor();
    opt.step_pieces(octx, params, pieces, lowp.defined() ? &lowp : nullptr, 0, lr, grad_scale);
    return;
  }
  for (int i = static_cast<int>(ranges.size()) - 1; i >= 0; --i) {
    auto& g = ranges[static_cast<std::size_t>(i)];
    opt.step_range(octx, g.params, g.grads, g.lowp.defined() ? &g.lowp : nullptr, g.offset, lr, grad_scale);
    if (overlap_optimizer_)
      pending_updates_.push_back({g.segment, update_segments_[static_cast<std::size_t>(g.segment)].first_unit,
                                  rt.mark(octx), {}});
  }
}

double Trainer::forward_loss(const std::vector<std::int32_t>& tokens, std::int64_t T, StepTimes* times) {
  settle_optimizer();
  ops::Runtime& rt = env_.rt;
  Context& ctx = rt.ctx();
  const std::int64_t rows = static_cast<std::int64_t>(tokens.size()) / (T + 1);
  auto [in, tg] = upload(tokens, T, 0, rows);
  auto t0 = rt.mark();
  Tensor loss_sum;
  ops::Runtime::GemmCarveout carve(rt, carve_forward_);
  if (pipeline_) {
    loss_sum = pipeline_->forward_only(in, tg, T);
    if (!loss_sum.defined()) {   // not the last stage: it contributes 0 to the sum over stages
      loss_sum = Tensor::empty({1}, DType::f32, *ctx.allocator, "loss");
      ops::fill(ctx, loss_sum, 0.0);
    }
  } else {
    loss_sum = model_->forward(ctx, in, tg, false, 1.0, with_tp(sync_->forward_hooks(false)))->loss_sum;
  }
  auto t1 = rt.mark();
  if (times) times->forward_ms = rt.elapsed_ms(t0, t1);
  rt.allocator().tracker().mark_phase("forward");
  return reduce_loss(loss_sum, static_cast<double>(sync_->sum_scalar(static_cast<double>(rows)) * T));
}

std::vector<float> Trainer::full_parameters() {
  settle_optimizer();
  Context& ctx = env_.rt.ctx();
  if (fsdp_) return to_full_layout(fsdp_->full_parameters(ctx));   // gathered over dp, then over tp
  if (sharded_) sharded_->complete_master(ctx);   // ZeRO gathered only the working copy after its steps
  LMSCALE_CHECK(params_->master_dtype() == DType::f32, "full_parameters: fp32 master weights only");
  std::vector<float> h(static_cast<std::size_t>(params_->numel()));
  Tensor dst = Tensor::view(h.data(), {params_->numel()}, DType::f32, Device::cpu);
  ops::copy(ctx, params_->flat_params(), dst);
  return to_full_layout(h);
}

void Trainer::set_parameters(const std::vector<float>& full) {
  settle_optimizer();
  Context& ctx = env_.rt.ctx();
  if (fsdp_) return fsdp_->set_parameters(ctx, to_local_layout(full));   // this tp rank's slices, sharded over dp
  const std::vector<float> flat = to_local_layout(full);   // this stage's parameters, this tp rank's slices
  LMSCALE_CHECK(static_cast<std::int64_t>(flat.size()) == params_->numel(), "set_parameters: {} values for {}",
                flat.size(), params_->numel());
  Tensor src = Tensor::view(const_cast<float*>(flat.data()), {params_->numel()}, DType::f32, Device::cpu);
  ops::copy(ctx, src, params_->flat_params());
  params_->refresh_lowp(ctx);
}

std::vector<float> Trainer::to_full_layout(const std::vector<float>& local) {
  // Tensor parallel: the tp ranks' slices -> this store's parameters whole (in store order).
  std::vector<float> whole = tp_ ? tp_->gather_full(params_->infos(), local) : local;
  if (!pipeline_) return whole;   // the whole model: already the full layout
  // Pipeline: every rank's store (its chunks' parameters, in chunk order), all-gathered over the
  // pp group of the host communicator, then each parameter put at its place in the full layout.
  comm::Communicator& pp = host_mesh_->pp();
  std::vector<std::size_t> counts(static_cast<std::size_t>(pp.size()));
  const double mine = static_cast<double>(whole.size());
  std::vector<double> all(counts.size());
  pp.all_gather(&mine, all.data(), 1, DType::f64).wait();
  std::size_t total = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) total += counts[i] = static_cast<std::size_t>(all[i]);
  std::vector<float> gathered(total);
  pp.all_gather_v(whole.data(), gathered.data(), counts, DType::f32).wait();
  const auto& pc = env_.cfg.parallel;
  const int V = pc.schedule == PipelineSchedule::interleaved ? static_cast<int>(pc.virtual_stages) : 1;
  const auto layout = model::parameter_layout(dims_);
  std::vector<float> full(static_cast<std::size_t>(dims_.parameter_count()));
  std::size_t at = 0;
  for (int r = 0; r < pp.size(); ++r) {
    for (const auto& u : model::pipeline_chunks(dims_, pp.size(), V, r, pc.stage_layers)) {
      for (int g = u.first_param(dims_); g < u.end_param(dims_); ++g) {
        const auto& p = layout[static_cast<std::size_t>(g)];
        std::copy(gathered.begin() + static_cast<std::ptrdiff_t>(at),
                  gathered.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(p.numel)),
                  full.begin() + p.offset);
        at += static_cast<std::size_t>(p.numel);
      }
    }
  }
  LMSCALE_CHECK(at == total, "to_full_layout: {} gathered values, {} placed", total, at);
  return full;
}

std::vector<float> Trainer::to_local_layout(const std::vector<float>& full) const {
  LMSCALE_CHECK(static_cast<std::int64_t>(full.size()) == dims_.parameter_count(),
                "to_local_layout: {} values for a model of {}", full.size(), dims_.parameter_count());
  // This store's parameters whole, in store order (a pipeline stage: its chunks' parameters).
  std::vector<float> whole;
  if (pipeline_) {
    const auto layout = model::parameter_layout(dims_);
    for (int i = 0; i < params_->size(); ++i) {
      const auto& g = layout[static_cast<std::size_t>(params_->global_index(i))];
      whole.insert(whole.end(), full.begin() + g.offset, full.begin() + g.offset + g.numel);
    }
  } else {
    whole = full;
  }
  return tp_ ? tp_->slice_local(params_->infos(), whole) : whole;   // tensor parallel: this rank's slices
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
