// Random operands for the kernel benchmarks: see include/lmscale/jobs/bench_random.h.
#include "lmscale/jobs/bench_random.h"

#include <algorithm>

#include "lmscale/core/rng.h"
#include "lmscale/ops/ops.h"

namespace lmscale::jobs {

void fill_random(ops::Runtime& rt, Tensor& t, std::uint64_t key) {
  Context& ctx = rt.ctx();
  const std::int64_t block = std::min<std::int64_t>(t.numel(), 1 << 20);
  Tensor host64 = Tensor::empty({block}, DType::f64, rt.host(), "bench_random");
  CounterRng rng(12345, key);
  for (std::int64_t i = 0; i < block; ++i) host64.data_as<double>()[i] = rng.normal(static_cast<std::uint64_t>(i));
  Tensor host = host64;
  if (t.dtype() != DType::f64) {
    host = Tensor::empty({block}, t.dtype(), rt.host(), "bench_random");
    Context host_ctx;
    host_ctx.device = Device::cpu;
    host_ctx.allocator = &rt.host();
    host_ctx.host = &rt.host();
    ops::cast(host_ctx, host64, host);
  }
  for (std::int64_t off = 0; off < t.numel(); off += block) {
    const std::int64_t n = std::min(block, t.numel() - off);
    Tensor dst = t.flat_range(off, n);
    ops::copy(ctx, host.flat_range(0, n), dst);
  }
}

}  // namespace lmscale::jobs
