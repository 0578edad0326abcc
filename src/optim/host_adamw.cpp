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

void HostAdamW::step_host(Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr,
                          double grad_scale, ops::AdamWArithmetic arithmetic) {
  const std::int64_t n = params.numel();
  check_range("HostAdamW", offset, n, grads.numel());
  Tensor m = state(0).flat_range(offset, n), v = state(1).flat_range(offset, n);
  Tensor p = params.reshape({n});
  ops::adamw_host(p, grads.reshape({n}), m, v, adamw_hyper(cfg_, t_, lr, grad_scale), lowp, arithmetic, threads_);
}

void HostAdamW::step_range(Context&, Tensor&, const Tensor&, Tensor*, std::int64_t, double, double) {
  throw Error("HostAdamW: the offloaded state is updated on the host through parallel::OffloadedShards, not by "
              "step_range()");
}

int host_adamw_threads(int local_ranks, std::int64_t requested) {
  if (requested > 0) return static_cast<int>(requested);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, hw / std::max(1, local_ranks));
}

}  // namespace lmscale::optim
