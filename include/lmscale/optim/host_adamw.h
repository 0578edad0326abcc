#pragma once
// AdamW whose moments live in host memory and whose update runs on the host (parallel.offload =
// optimizer, docs/parallel.md "CPU offload: parallel.offload"). It is an optim::Optimizer over the
// range a rank owns (the whole store for one process, the rank's shard for zero1/zero2/fsdp), so
// the strategies and the checkpoints (state tensors "m", "v", the step count) see no difference;
// only where the state lives and who computes changes.
//
// Its update is step_host() over host memory; parallel::OffloadedShards (parallel/offloaded_shards.h)
// drives it chunk by chunk on a worker thread for every mode, with the master beside it on the
// host, so step_range() (the device-side interface) is refused.
#include <cstdint>

#include "lmscale/ops/host_adamw.h"
#include "lmscale/optim/optimizer.h"

namespace lmscale::optim {

class HostAdamW final : public Optimizer {
 public:
  // m, v: numel fp32 zeros in host memory (ctx.host). threads: the host AdamW's threads.
  HostAdamW(const OptimConfig& cfg, std::int64_t numel, Context& ctx, int threads);

  std::string name() const override { return "adamw"; }
  // Refused: the state is on the host, its update is step_host() (parallel/offloaded_shards.h).
  void step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr,
                  double grad_scale) override;

  // The update of host memory only: params, grads (and lowp) are host tensors holding elements
  // [offset, offset + params.numel()) of the state, updated in `arithmetic` (the device's AdamW
  // for an offloaded GPU run, bitwise). One thread at a time; begin_step() comes before.
  void step_host(Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset, double lr, double grad_scale,
                 ops::AdamWArithmetic arithmetic);

 private:
  OptimConfig cfg_;
  int threads_;
};

// Threads for the host AdamW of one rank: the hardware threads over the ranks sharing the host
// (local_ranks), at least 1.
int host_adamw_threads(int local_ranks, std::int64_t requested = 0);

}  // namespace lmscale::optim
