#include "lmscale/optim/host_adamw.h"

#include <algorithm>
#include <thread>

#include "lmscale/core/error.h"
#include "lmscale/ops/ops.h"
#include "lmscale/optim/adamw.h"

namespace lmscale::optim {

namespace {
// A context whose allocations land in host memory.
Context host_context(const Context& ctx) {
  Context h;
  h.device = Device::cpu;
  h.allocator = ctx.host ? ctx.host : ctx.allocator;
  h.host = h.allocator;
  return h;
}
}  // namespace

HostAdamW::HostAdamW(const OptimConfig& cfg, std::int64_t numel, Context& ctx, int threads)
    : Optimizer(numel, 0, {}), cfg_(cfg), threads_(std::max(1, threads)) {
  Context h = host_context(ctx);
  LMSCALE_CHECK(h.allocator && h.allocator->device() == Device::cpu, "HostAdamW: the context has no host allocator");
  add_state("m", DType::f32, h);
  add_state("v", DType::f32, h);
}

void HostAdamW::reserve(std::int64_t n, DType low_dtype, Context& ctx) {
  Allocator& host = *host_context(ctx).allocator;
  if (!host_params_.defined() || host_params_.numel() < n) {
    host_params_ = Tensor::empty({n}, DType::f32, host, "offload_staging");
    host_grads_ = Tensor::empty({n}, DType::f32, host, "offload_staging");
  }
  if (low_dtype != DType::f32 && (!host_low_.defined() || host_low_.numel() < n || host_low_.dtype() != low_dtype))
    host_low_ = Tensor::empty({n}, low_dtype, host, "offload_staging");
}


void HostAdamW::step_host(Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr,
                          double grad_scale, ops::AdamWArithmetic arithmetic) {
  const std::int64_t n = params.numel();
  check_range("HostAdamW", offset, n, grads.numel());
  Tensor m = state(0).flat_range(offset, n), v = state(1).flat_range(offset, n);
  Tensor p = params.reshape({n});
  ops::adamw_host(p, grads.reshape({n}), m, v, adamw_hyper(cfg_, t_, lr, grad_scale), lowp, arithmetic, threads_);
}

void HostAdamW::step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset,
                           double lr, double grad_scale) {
  const std::int64_t n = params.numel();
  check_range("HostAdamW", offset, n, grads.numel());
  if (t_ != last_t_) {
    last_t_ = t_;
    transfer_bytes_ = 0;
  }
  LMSCALE_CHECK(params.dtype() == DType::f32 && grads.dtype() == DType::f32,
                "HostAdamW: fp32 parameters and gradients expected, got {} and {}", dtype_name(params.dtype()),
                dtype_name(grads.dtype()));
  Tensor p = params.reshape({n});
  Tensor g = grads.reshape({n});
  if (params.device() == Device::cpu) {
    // The device is the host: update the store in place, in the CPU reference's arithmetic.
    return step_host(p, g, lowp, offset, lr, grad_scale, ops::AdamWArithmetic::cpu_reference);
  }
  const DType low_dtype = lowp ? lowp->dtype() : DType::f32;
  reserve(n, low_dtype, ctx);
  Tensor hp = host_params_.flat_range(0, n), hg = host_grads_.flat_range(0, n);
  Tensor hl = lowp ? host_low_.flat_range(0, n) : Tensor();
  ops::copy(ctx, p, hp);   // D2H, waits for the compute stream (the backward, the clip's norm)
  ops::copy(ctx, g, hg);
  step_host(hp, hg, lowp ? &hl : nullptr, offset, lr, grad_scale, ops::AdamWArithmetic::cuda_kernel);
  ops::copy(ctx, hp, p);   // H2D, ordered before the next forward on the compute stream
  if (lowp) {
    Tensor l = lowp->reshape({n});
    ops::copy(ctx, hl, l);
  }
  transfer_bytes_ += n * (8 + 4) + (lowp ? n * static_cast<std::int64_t>(dtype_size(low_dtype)) : 0);
}

int host_adamw_threads(int local_ranks, std::int64_t requested) {
  if (requested > 0) return static_cast<int>(requested);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, hw / std::max(1, local_ranks));
}

}  // namespace lmscale::optim
