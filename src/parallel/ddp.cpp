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
  if (mode == DdpMode::bucketed)
    reducer_.emplace(gradient_buckets(params.infos(), bucket_mb * 1024.0 * 1024.0, dtype_size(params.master_dtype())),
                     params.size(), static_cast<BucketBackend&>(*this));
  else if (mode == DdpMode::overlap)
    reducer_.emplace(one_bucket_per_parameter(params.infos()), params.size(), static_cast<BucketBackend&>(*this));
}

DataParallel::~DataParallel() = default;

void DataParallel::use_copy_engine(ops::Runtime& rt) {
  LMSCALE_CHECK(mode_ == DdpMode::bucketed && reduce_dtype_ == DType::f32 && rt.device() == Device::cuda &&
                    params_.flat_grads().dtype() == DType::f32,
                "parallel.grad_exchange = copy-engine needs bucketed DDP over CUDA with fp32 gradients");
  copy_engine_ = std::make_unique<CopyEngineAllReduce>(host_, params_.flat_grads(), reducer_->buckets(), rt);
  reducer_->set_backend(*copy_engine_);
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

void DataParallel::all_reduce_range(std::int64_t offset, std::int64_t numel) {
  Tensor g = params_.flat_grads().flat_range(offset, numel);
  if (reduce_dtype_ == g.dtype()) {
    inflight_.add(grads_.all_reduce(g, comm::ReduceOp::sum, comm::async_call()));
    return;
  }
  // [numel] in the reduce dtype, allocated and filled on the compute stream (the collective
  // waits for it), widened back after the wait.
  Tensor stage = Tensor::empty({numel}, reduce_dtype_, *ctx_->allocator, "grad_reduce_stage");
  ops::cast(*ctx_, g, stage);
  inflight_.add_staged(grads_.all_reduce(stage, comm::ReduceOp::sum, comm::async_call()), stage, g);
}

void DataParallel::launch(int bucket) {
  const GradBucket& k = reducer_->buckets()[static_cast<std::size_t>(bucket)];
  all_reduce_range(k.offset, k.numel);
}

model::ParallelContext DataParallel::hooks(int micro, int micro_count) {
  return reducer_ ? reducer_->hooks(micro, micro_count) : model::ParallelContext{};
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
        all_reduce_range(0, params_.flat_grads().numel());
        inflight_.wait(ctx_);
      }
      break;
    case DdpMode::overlap:
    case DdpMode::bucketed:
      reducer_->finish();
      break;
  }
}

double DataParallel::sum_scalar(double x) { return comm::sum_over(host_, x); }

}  // namespace lmscale::parallel
