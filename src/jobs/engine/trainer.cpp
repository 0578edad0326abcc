#include "lmscale/jobs/engine/trainer.h"

#include <algorithm>
#include <cmath>

#include "lmscale/comm/communicator.h"
#include "lmscale/comm/mesh.h"
#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/model/stage.h"
#include "lmscale/ops/ops.h"
#include "lmscale/optim/adamw.h"
#include "lmscale/optim/grad_clip.h"
#include "lmscale/parallel/expert_parallel.h"
#include "lmscale/parallel/full_layout.h"
#include "lmscale/parallel/pipeline.h"
#include "lmscale/parallel/pipeline_schedule.h"
#include "lmscale/parallel/sequential_schedule.h"
#include "lmscale/parallel/spec.h"
#include "lmscale/parallel/tensor_parallel.h"

namespace lmscale::jobs {

namespace {
// Master weights, gradients and optimizer state are fp32 in every precision mode (docs/architecture.md §2).
constexpr DType kMaster = DType::f32;
// Linear LR scaling (Goyal et al. 2017): lr x global batch / reference batch, global batch = the
// sequences of one optimizer step over all data-parallel ranks and micro-batches.
double linear_lr_scale(const OptimConfig& o, std::int64_t global_batch) {
  return o.reference_batch > 0 ? static_cast<double>(global_batch) / static_cast<double>(o.reference_batch) : 1.0;
}
// fp8: bf16 around the FP8 GEMMs on a GPU; the CPU emulation computes the rest as fp32 runs do
// (docs/precision.md).
DType lowp_dtype(const Config& c, Device device) {
  switch (c.precision.mode) {
    case PrecisionMode::fp8: return device == Device::cuda ? DType::bf16 : DType::f32;
    case PrecisionMode::bf16: return DType::bf16;
    case PrecisionMode::fp16: return DType::f16;
    case PrecisionMode::fp32: break;
  }
  return DType::f32;
}
model::ParameterStore::Buffers store_buffers(parallel::GradStorage g) {
  using Buffers = model::ParameterStore::Buffers;
  switch (g) {
    case parallel::GradStorage::shards: return Buffers::none;
    case parallel::GradStorage::lazy_buckets: return Buffers::params_only;
    case parallel::GradStorage::flat: break;
  }
  return Buffers::params_and_grads;
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
      lr_scale_(linear_lr_scale(env.cfg.optim, global_batch)) {
  Context& ctx = env.rt.ctx();
  const auto& pc = env.cfg.parallel;
  // The dp x tp x pp mesh (comm/mesh.h; tp ranks adjacent: rank = (pp_idx*dp + dp_idx)*tp +
  // tp_idx); dp = world is its 1 x 1 case, whose dp group is the world communicator. The ranks of
  // a tp group take the same rows and each holds its slices of the parameters; every stage of a
  // dp replica reads the same rows, each stage's dp ranks split the batch as without pp.
  parallel::Spec spec = parallel::Spec::resolve(pc, env.world);
  LMSCALE_CHECK(env.world == 1 || (env.comm && env.host_comm), "a job of {} ranks needs the world communicators",
                env.world);
  if (env.comm) {
    // Set before the split: the mesh's communicators inherit the compute stream.
    if (env.comm->device() == Device::cuda) env.comm->set_compute_stream(ctx.stream);
    mesh_ = std::make_unique<comm::Mesh>(env.comm, spec.mesh_shape());
    host_mesh_ = std::make_unique<comm::Mesh>(env.host_comm, spec.mesh_shape());
    dp_rank_ = mesh_->coords().dp;
  }
  if (spec.tp > 1)
    tp_ = std::make_unique<parallel::TensorParallel>(mesh_->tp(), host_mesh_->tp(), pc.sequence_parallel);
  // Expert parallelism: the experts split over the ep group inside dp (rows of the batch are still
  // split over the whole dp group: each rank routes its own tokens).
  if (spec.ep > 1) ep_ = std::make_unique<parallel::ExpertParallel>(mesh_->ep(), host_mesh_->ep());
  // This rank's stage, or its virtual_stages chunks under the interleaved schedule.
  const int V = pc.schedule == PipelineSchedule::interleaved ? static_cast<int>(pc.virtual_stages) : 1;
  const std::vector<model::StageUnits> chunks =
      spec.pp > 1 ? model::pipeline_chunks(dims_, spec.pp, V, mesh_->coords().pp, pc.stage_layers)
                  : std::vector<model::StageUnits>{model::StageUnits::all()};
  dp_size_ = spec.dp;
  LMSCALE_CHECK(global_batch % dp_size_ == 0, "batch_size {} not divisible by {} data-parallel ranks", global_batch,
                dp_size_);
  local_rows_ = global_batch / dp_size_;
  first_row_ = dp_rank_ * local_rows_;
  LMSCALE_CHECK(local_rows_ % grad_accum == 0, "local batch {} not divisible by grad_accum {}", local_rows_, grad_accum);
  params_ = std::make_unique<model::ParameterStore>(dims_, kMaster, lowp_dtype(env.cfg, ctx.device), *ctx.allocator,
                                                    store_buffers(spec.grad_storage()),
                                                    tp_ ? tp_->split() : model::TensorSplit{}, chunks,
                                                    ep_ ? ep_->split() : model::ExpertSplit{},
                                                    spec.master_in_store() ? model::ParameterStore::MasterCopy::whole
                                                                           : model::ParameterStore::MasterCopy::read_ranges);
  params_->init(env.cfg.run.seed, ctx);
  // parallel.ep_exchange = copy-engine: the receive window holds one micro-batch's routed rows per
  // other ep rank, in the compute dtype (larger calls, an evaluation's whole local batch, go in
  // chunks: parallel/copy_engine_all_to_all.h).
  if (spec.ep_exchange_window())
    ep_->use_copy_engine(env.rt, parallel::CopyEngineAllToAll::slot_bytes(dims_, local_rows_ / grad_accum,
                                                                          dtype_size(params_->lowp_dtype())));
  // One model per chunk over the one store (a single one without the interleaved schedule).
  for (const auto& u : chunks) chunk_models_.push_back(std::make_unique<model::TransformerLM>(dims_, *params_, u));
  for (auto& m : chunk_models_) m->set_recompute(model::RecomputePolicy::from(env.cfg.train));
  if (env.cfg.precision.mode == PrecisionMode::fp8)
    for (auto& m : chunk_models_) m->enable_fp8(ctx, model::fp8_options(env.cfg.precision));
  const model::TensorParallelComm tp_comm = tp_ ? tp_->callbacks() : model::TensorParallelComm{};
  if (spec.pp > 1) {
    if (env.comm->device() == Device::cuda) mesh_->pp().set_compute_stream(ctx.stream);
    std::vector<model::TransformerLM*> models;
    for (auto& m : chunk_models_) models.push_back(m.get());
    auto pipe = std::make_unique<parallel::PipelineParallel>(models, mesh_->pp(), env.rt, pc.schedule, tp_comm);
    run_ = std::make_unique<parallel::PipelineSchedule>(std::move(pipe), host_mesh_->pp(), env.rt,
                                                        static_cast<int>(pc.microbatches));
  } else {
    run_ = std::make_unique<parallel::SequentialSchedule>(*chunk_models_.front(), env.rt, static_cast<int>(grad_accum),
                                                          tp_comm, ep_ ? ep_->callbacks() : model::ExpertParallelComm{});
  }
  parallel::StrategyParts parts{env.cfg, spec, env.rt, *params_, static_cast<int>(dims_.layers),
                                 spec.dp > 1 ? &mesh_->dp() : nullptr, spec.dp > 1 ? &host_mesh_->dp() : nullptr,
                                 dp_rank_, tp_.get(), spec.pp > 1};
  if (ep_) {
    const bool replicas = spec.gradient_group() > 1;
    parts.ep = ep_.get();
    parts.expert_dp = replicas ? &mesh_->expert_dp() : nullptr;
    parts.expert_dp_host = replicas ? &host_mesh_->expert_dp() : nullptr;
    parts.expert_dp_rank = mesh_->coords().expert_dp;
  }
  strategy_ = parallel::make_strategy(parts);
  // precision.fp8_weight_casts = optimizer where the layout allows it: the step casts the FP8
  // weights and the forwards read their codes (model/fp8_weight_casts.h).
  if (parallel::step_casts_fp8_weights(env.cfg, spec, grad_accum, ctx.device)) {
    chunk_models_.front()->enable_fp8_weight_casts(ctx);
    fp8_casts_ = chunk_models_.front()->fp8_weight_casts();
    strategy_->set_fp8_weight_casts(fp8_casts_);
  }
  layout_ = std::make_unique<parallel::FullLayout>(dims_, *params_, tp_.get(), spec.pp > 1 ? &host_mesh_->pp() : nullptr,
                                                   V, pc.stage_layers, ep_.get());
  memory_points_["after_init"] = env.rt.allocator().tracker().by_tag();
  // The deck refused the layouts and modes a captured step cannot hold (io/deck_cuda_graphs.cpp);
  // these checks hold the trainer to that.
  cuda_graphs_ = env.cfg.train.cuda_graphs;
  if (cuda_graphs_) {
    if (ctx.device != Device::cuda)
      throw UsageError("train.cuda_graphs = true needs a CUDA device; set train.cuda_graphs = false on CPUs");
    LMSCALE_CHECK(env.world == 1 && spec.tp == 1 && spec.pp == 1 && spec.ep == 1 && !strategy_->sharded() &&
                      dynamic_cast<optim::AdamW*>(strategy_->whole_optimizer()),
                  "train.cuda_graphs: one process with AdamW only (deck checks)");
  }
}

Trainer::~Trainer() {
  graphed_.reset();   // waits for a replay in flight, returns the graph's pool
  // No waiting for a pending update's collectives while an exception unwinds (core/error.h): the
  // peers may never complete them; the failing rank aborts the job. One rank has no peers to wait
  // for, and a sweep that catches an OutOfMemory goes on: it settles as usual.
  if (unwinding() && env_.world > 1) return;
  // The side stream may still read the parameters, state and gradients freed below.
  settle_optimizer();
  env_.rt.synchronize();
}

model::TransformerLM& Trainer::model() {
  settle_optimizer();
  return *chunk_models_.front();
}
optim::Optimizer* Trainer::optimizer() {
  settle_optimizer();
  return strategy_->whole_optimizer();
}
void Trainer::settle_optimizer() { strategy_->settle(); }
parallel::ShardedOptimizer* Trainer::sharded() { return strategy_->sharded(); }
std::size_t Trainer::param_gather_segments() const { return strategy_->param_gather_segments(); }
parallel::FullyShardedDataParallel* Trainer::fsdp() { return strategy_->fsdp(); }
parallel::GradientSync& Trainer::sync() { return strategy_->sync(); }
parallel::PipelineParallel* Trainer::pipeline() { return run_->pipeline(); }

parallel::MicroBatch Trainer::split_rows(const std::vector<std::int32_t>& tokens, std::int64_t T, std::int64_t r0,
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
  return {in_h, tg_h};
}

parallel::MicroBatch Trainer::upload(const std::vector<std::int32_t>& tokens, std::int64_t T, std::int64_t r0,
                                     std::int64_t r1) {
  Context& ctx = env_.rt.ctx();
  const std::int64_t rows = r1 - r0;
  const parallel::MicroBatch host = split_rows(tokens, T, r0, r1);
  const Tensor& in_h = host.inputs;
  const Tensor& tg_h = host.targets;
  if (ctx.device == Device::cpu) return host;
  Tensor in_d = Tensor::empty({rows, T}, DType::i32, *ctx.allocator, "batch");
  Tensor tg_d = Tensor::empty({rows, T}, DType::i32, *ctx.allocator, "batch");
  ops::copy(ctx, in_h, in_d);
  ops::copy(ctx, tg_h, tg_d);
  return {in_d, tg_d};
}

std::vector<double> Trainer::read_over_replicas(const std::vector<Tensor>& sums) {
  Context& ctx = env_.rt.ctx();
  // One device-to-host copy for the step's scalars: gathered into [n] on the device first.
  const std::int64_t n = static_cast<std::int64_t>(sums.size());
  const DType dt = sums.front().dtype();
  Tensor host = Tensor::empty({n}, dt, *ctx.host, "loss");
  if (n == 1) {
    ops::copy(ctx, sums.front(), host);
  } else {
    Tensor dev = Tensor::empty({n}, dt, *ctx.allocator, "loss");
    for (std::int64_t m = 0; m < n; ++m) {
      Tensor slot = dev.flat_range(m, 1);
      ops::copy(ctx, sums[static_cast<std::size_t>(m)], slot);
    }
    ops::copy(ctx, dev, host);
  }
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t m = 0; m < n; ++m)
    v[static_cast<std::size_t>(m)] = dt == DType::f64 ? host.data_as<double>()[m] : host.data_as<float>()[m];
  // Summed over the data-parallel replicas, then over the pipeline stages.
  if (dp_size_ > 1) {
    std::vector<double> out(v.size());
    host_mesh_->dp().all_reduce(v.data(), out.data(), v.size(), DType::f64, comm::ReduceOp::sum).wait();
    v = std::move(out);
  }
  run_->sum_over_stages(v);
  return v;
}

double Trainer::mean_loss(const std::vector<Tensor>& loss_sums, double tokens_global) {
  double loss = 0;
  for (double s : read_over_replicas(loss_sums)) loss += s / tokens_global;
  return loss;   // the loss itself is never scaled, only the gradient seed is
}

parallel::MicroBatchSource Trainer::uploads(const std::vector<std::int32_t>& tokens, std::int64_t T) {
  return [this, &tokens, T](int m, int count) {
    const std::int64_t rows = local_rows_ / count;
    return upload(tokens, T, m * rows, (m + 1) * rows);
  };
}

void Trainer::run_micro_batches(const parallel::MicroBatchSource& batches, std::int64_t T, StepResult& r,
                                std::vector<Tensor>& loss_sums) {
  const double grad_scale = scaler_.scale() / static_cast<double>(global_batch_ * T);
  parallel::PassTimes times;
  run_->forward_backward(batches, T, grad_scale, *strategy_, loss_sums, times);
  r.times.forward_ms = times.forward_ms;
  r.times.backward_ms = times.backward_ms;
  // The gradient reduction belongs to the backward (as in torch DDP): waited here, so no
  // collective is left in flight and ZeRO-2's buckets and the bf16 copies are released. The wait
  // is the step's exposed communication.
  ops::Runtime& rt = env_.rt;
  auto c0 = rt.mark();
  {
    NvtxRange n("gradient_sync");
    strategy_->sync().finish(rt.ctx());
  }
  r.times.comm_ms = rt.elapsed_ms(c0, rt.mark());
}

void Trainer::finish_pass_times(StepResult& r) {
  parallel::PassTimes times{r.times.forward_ms, r.times.backward_ms};
  run_->finish_timing(times);
  r.times.forward_ms = times.forward_ms;
  r.times.backward_ms = times.backward_ms;
}

StepResult Trainer::forward_backward(const std::vector<std::int32_t>& tokens, std::int64_t T) {
  settle_optimizer();
  StepResult r;
  std::vector<Tensor> loss_sums;
  run_micro_batches(uploads(tokens, T), T, r, loss_sums);
  r.loss = mean_loss(loss_sums, static_cast<double>(global_batch_ * T));
  finish_pass_times(r);
  r.times.total_ms = r.times.forward_ms + r.times.backward_ms + r.times.comm_ms;
  strategy_->release_gradients();
  return r;
}

StepResult Trainer::train_step(const std::vector<std::int32_t>& tokens, std::int64_t T) {
  NvtxRange range("train_step");
  faults_.at_step_start(env_.rank, step_);   // test-only: one rank hangs here
  return cuda_graphs_ ? graphed_step(tokens, T) : eager_step(tokens, T);
}

StepResult Trainer::eager_step(const std::vector<std::int32_t>& tokens, std::int64_t T) {
  ops::Runtime& rt = env_.rt;
  Context& ctx = rt.ctx();
  StepResult r;
  auto t_start = rt.mark();
  std::vector<Tensor> loss_sums;
  run_micro_batches(uploads(tokens, T), T, r, loss_sums);

  NvtxRange n("optimizer");
  memory_points_["before_optimizer"] = rt.allocator().tracker().by_tag();
  auto o0 = rt.mark();
  // Gradients hold loss_scale * d(mean loss)/dw; clipping works on the unscaled norm. Pipeline:
  // each stage holds its own parameters' gradients (squares add over the stages).
  const double inv_scale = 1.0 / scaler_.scale();
  std::vector<double> sq{strategy_->grad_sum_squares(ctx)};
  run_->sum_over_stages(sq);
  const double norm = std::sqrt(sq.front()) * inv_scale;
  const bool finite = std::isfinite(norm);
  r.grad_norm = norm;
  r.loss_scale = scaler_.scale();
  r.lr = schedule_.at(step_);
  if (scaler_.update(!finite) && finite) {
    strategy_->step(ctx, r.lr, inv_scale * optim::clip_factor(norm, env_.cfg.optim.grad_clip));
  } else {
    r.skipped = true;
    // The step's casts did not run: the unchanged weights cast now, as a captured step's kernel
    // casts them (an evaluation before the next step reads these codes; the working copy of the
    // cast weights is not kept).
    if (fp8_casts_) fp8_casts_->cast_now(ctx);
  }
  strategy_->release_gradients();   // (bucket by bucket by the next forward when an update is in flight)
  auto o1 = rt.mark();
  r.times.optimizer_ms = rt.elapsed_ms(o0, o1);
  rt.allocator().tracker().mark_phase("optimizer");
  memory_points_["after_optimizer"] = rt.allocator().tracker().by_tag();
  r.loss = mean_loss(loss_sums, static_cast<double>(global_batch_ * T));
  r.times.total_ms = rt.elapsed_ms(t_start, o1);
  finish_pass_times(r);
  ++step_;
  return r;
}

double Trainer::forward_loss(const std::vector<std::int32_t>& tokens, std::int64_t T, StepTimes* times) {
  settle_optimizer();
  ops::Runtime& rt = env_.rt;
  const std::int64_t rows = static_cast<std::int64_t>(tokens.size()) / (T + 1);
  const parallel::MicroBatch batch = upload(tokens, T, 0, rows);
  auto t0 = rt.mark();
  Tensor loss_sum = run_->forward_only(batch, T, *strategy_);
  auto t1 = rt.mark();
  if (times) times->forward_ms = rt.elapsed_ms(t0, t1);
  rt.allocator().tracker().mark_phase("forward");
  const double tokens_global = strategy_->sync().sum_scalar(static_cast<double>(rows)) * static_cast<double>(T);
  return mean_loss({loss_sum}, tokens_global);
}

std::vector<float> Trainer::full_parameters() {
  // Gathered over dp (fsdp) or completed (ZeRO), then over tp and pp.
  return layout_->to_full(strategy_->master_parameters(env_.rt.ctx()));
}

void Trainer::set_parameters(const std::vector<float>& full) {
  // This stage's parameters, this tp rank's slices (sharded over dp under fsdp).
  strategy_->set_master_parameters(env_.rt.ctx(), layout_->to_local(full));
  weights_replaced();
}

void Trainer::weights_replaced() {
  if (fp8_casts_) fp8_casts_->weights_replaced();
}

std::vector<float> Trainer::to_full_layout(const std::vector<float>& local) { return layout_->to_full(local); }
std::vector<float> Trainer::to_local_layout(const std::vector<float>& full) const { return layout_->to_local(full); }

}  // namespace lmscale::jobs
