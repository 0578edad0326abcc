#include "lmscale/parallel/ddp.h"

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/ops/ops.h"
#include "lmscale/parallel/copy_engine_all_reduce.h"

namespace lmscale::parallel {

DdpMode ddp_mode_of(DdpKind kind) {
  switch (kind) {
    case DdpKind::naive: return DdpMode::naive;
    case DdpKind::none:
    case DdpKind::flat: return DdpMode::flat;
    case DdpKind::overlap: return DdpMode::overlap;
    case DdpKind::bucketed: return DdpMode::bucketed;
  }
  throw UsageError(fmt::format("parallel.ddp = {}: not a data-parallel mode (naive, flat, overlap, bucketed)", kind));
}

const char* ddp_mode_name(DdpMode m) {
  switch (m) {
    case DdpMode::naive: return "naive";
    case DdpMode::flat: return "flat";
    case DdpMode::overlap: return "overlap";
    case DdpMode::bucketed: return "bucketed";
  }
  return "?";
}

DataParallel::DataParallel(DdpMode mode, comm::Communicator& grads, comm::Communicator& host,
                           model::ParameterStore& params, double bucket_mb)
    : mode_(mode), grads_(grads), host_(host), params_(params) {
  LMSCALE_CHECK(grads.size() == host.size(), "gradient and host communicators differ in size");
  if (mode == DdpMode::bucketed) {
    buckets_ = make_buckets(params.infos(), bucket_mb * 1024.0 * 1024.0, dtype_size(params.master_dtype()));
    bucket_of_ = parallel::bucket_index(buckets_, params.size());
    pending_.assign(buckets_.size(), 0);
  }
}

DataParallel::~DataParallel() = default;

void DataParallel::use_copy_engine(ops::Runtime& rt) {
  LMSCALE_CHECK(mode_ == DdpMode::bucketed && reduce_dtype_ == DType::f32 && rt.device() == Device::cuda &&
                    params_.flat_grads().dtype() == DType::f32,
                "parallel.grad_exchange = copy-engine needs bucketed DDP over CUDA with fp32 gradients");
  copy_engine_ = std::make_unique<CopyEngineAllReduce>(host_, params_.flat_grads(), buckets_, rt);
}

void DataParallel::broadcast_parameters(Context& ctx) {
  grads_.broadcast(params_.flat_params(), 0);
  params_.refresh_lowp(ctx);
}

void DataParallel::set_reduce_dtype(DType dtype, Context& ctx) {
  LMSCALE_CHECK(dtype == DType::f32 || mode_ != DdpMode::naive, "ddp naive reduces in the gradients' own dtype");
  reduce_dtype_ = dtype;
  ctx_ = &ctx;
}

void DataParallel::launch(std::int64_t offset, std::int64_t numel) {
  Tensor g = params_.flat_grads().flat_range(offset, numel);
  if (reduce_dtype_ == g.dtype()) {
    inflight_.push_back(grads_.all_reduce(g, comm::ReduceOp::sum, comm::async_call()));
    return;
  }
  // [numel] in the reduce dtype, allocated and filled on the compute stream (the collective
  // waits for it), widened back in finish().
  Tensor stage = Tensor::empty({numel}, reduce_dtype_, *ctx_->allocator, "grad_reduce_stage");
  ops::cast(*ctx_, g, stage);
  inflight_.push_back(grads_.all_reduce(stage, comm::ReduceOp::sum, comm::async_call()));
  staged_.push_back({stage, g});
}

void DataParallel::widen_staged() {
  for (auto& s : staged_) ops::cast(*ctx_, s.stage, s.dst);
  staged_.clear();   // the stage buffers return to the stream-ordered allocator after the casts
}

void DataParallel::on_ready(int i) {
  const auto& p = params_.infos()[static_cast<std::size_t>(i)];
  if (mode_ == DdpMode::overlap) {
    launch(p.offset, p.numel);
  } else if (mode_ == DdpMode::bucketed) {
    const int b = bucket_of_[static_cast<std::size_t>(i)];
    if (--pending_[static_cast<std::size_t>(b)] != 0) return;
    if (copy_engine_)
      copy_engine_->bucket_ready(b);
    else
      launch(buckets_[static_cast<std::size_t>(b)].offset, buckets_[static_cast<std::size_t>(b)].numel);
  }
}

model::ParallelContext DataParallel::hooks(int micro, int micro_count) {
  model::ParallelContext pc;
  if (micro + 1 != micro_count || (mode_ != DdpMode::overlap && mode_ != DdpMode::bucketed)) return pc;
  for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].last - buckets_[b].first + 1;
  inflight_.clear();
  staged_.clear();
  if (copy_engine_) copy_engine_->begin();
  pc.on_grad_ready = [this](int i) { on_ready(i); };
  return pc;
}

void DataParallel::finish(Context& ctx) {
  (void)ctx;
  NvtxRange r("ddp_finish");
  switch (mode_) {
    case DdpMode::naive:
      for (int i = 0; i < params_.size(); ++i) {
        Tensor g = params_.grad(i);
        grads_.all_reduce(g, comm::ReduceOp::sum).wait();
      }
      break;
    case DdpMode::flat:
      if (reduce_dtype_ == params_.flat_grads().dtype()) {
        grads_.all_reduce(params_.flat_grads(), comm::ReduceOp::sum).wait();
      } else {
        launch(0, params_.flat_grads().numel());
        for (auto& w : inflight_) w.wait();
        inflight_.clear();
        widen_staged();
      }
      break;
    case DdpMode::overlap:
    case DdpMode::bucketed:
      // Checked first: a bucket missing here would leave the copy-engine waits below (and the
      // other ranks') blocked on signals that never come.
      if (mode_ == DdpMode::bucketed)
        for (std::size_t b = 0; b < buckets_.size(); ++b)
          LMSCALE_CHECK(pending_[b] == 0, "bucket {} still waits for {} gradients after the backward", b, pending_[b]);
      if (copy_engine_) copy_engine_->finish();
      for (auto& w : inflight_) w.wait();
      widen_staged();
      inflight_.clear();
      break;
  }
}

double DataParallel::sum_scalar(double x) { return comm::sum_over(host_, x); }

}  // namespace lmscale::parallel
