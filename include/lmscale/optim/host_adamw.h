#pragma once
// AdamW whose moments live in host memory and whose update runs on the host (parallel.offload =
// optimizer, docs/parallel.md "CPU offload: parallel.offload"). It drives the same interface as
// optim::AdamW over the same range (the whole store for one process, the rank's shard for
// zero1/zero2), so the strategies, the checkpoints (state tensors "m", "v") and the norms see no
// difference; only where the state lives and who computes changes.
//
// step_range(params, grads, lowp) over one range (a gradient bucket, or a shard):
//   device run:  params, grads  --D2H-->  host staging;  ops::adamw_host (m, v in host memory);
//                host master    --H2D-->  params;  host working copy --H2D--> lowp
//   CPU run:     ops::adamw_host in place (the device is the host: no copies)
// with the arithmetic of the device's own AdamW kernel (ops/host_adamw.h), so the results are
// those of parallel.offload = none, bit for bit.
//
// Not built yet (docs/parallel.md): the fp32 master stays in the device store (this phase moves
// m and v, 8 of the 16 bytes per parameter the optimizer keeps on the device, and the update);
// copies are synchronous on the compute stream and use pageable host memory; they do not
// overlap the backward.
#include <cstdint>

#include "lmscale/core/allocator.h"
#include "lmscale/ops/host_adamw.h"
#include "lmscale/optim/optimizer.h"

namespace lmscale::optim {

class HostAdamW final : public Optimizer {
 public:
  // m, v: numel fp32 zeros in host memory (ctx.host). threads: the host AdamW's threads.
  HostAdamW(const OptimConfig& cfg, std::int64_t numel, Context& ctx, int threads);

  std::string name() const override { return "adamw"; }
  void step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr,
                  double grad_scale) override;

  // The update of host memory only: params, grads (and lowp) are host tensors holding elements
  // [offset, offset + params.numel()) of the state, updated in `arithmetic` (the device's AdamW
  // for an offloaded GPU run, bitwise). One thread at a time; begin_step() comes before.
  void step_host(Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr, double grad_scale,
                 ops::AdamWArithmetic arithmetic);

 private:
  // Host staging of at least n elements (grown on demand, reused across steps).
  void reserve(std::int64_t n, DType low_dtype, Context& ctx);

  OptimConfig cfg_;
  int threads_;
  Tensor host_params_, host_grads_, host_low_;   // staging, [capacity]
};

// Threads for the host AdamW of one rank: the hardware threads over the ranks sharing the host
// (local_ranks), at least 1.
int host_adamw_threads(int local_ranks, std::int64_t requested = 0);

}  // namespace lmscale::optim
