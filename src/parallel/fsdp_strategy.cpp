#include "lmscale/parallel/fsdp_strategy.h"

#include "lmscale/core/error.h"
#include "lmscale/model/fp8_layers.h"
#include "lmscale/model/param_layout.h"
#include "lmscale/optim/host_adamw.h"
#include "lmscale/parallel/tensor_parallel.h"

namespace lmscale::parallel {

FsdpStrategy::FsdpStrategy(const StrategyParts& parts) : Strategy(parts) {
  Context& ctx = parts.rt.ctx();
  LMSCALE_CHECK(parts.dp && parts.dp_host, "data parallelism needs the world communicators");
  if (parts.dp->device() == Device::cuda) parts.dp->set_compute_stream(ctx.stream);
  FsdpOptions opt = FsdpOptions::from(parts.cfg.parallel);
  // parallel.offload = optimizer: the host threads are split over the dp ranks, assumed to share
  // one host (docs/parallel.md, "CPU offload").
  opt.offload_threads = optim::host_adamw_threads(spec_.dp, parts.cfg.parallel.offload_threads);
  // FP8 weight gathers (io validates precision.mode = fp8 with current scaling).
  opt.gather_fp8 = parts.cfg.parallel.fsdp_gather_dtype == FsdpGatherDtype::fp8;
  opt.fp8_margin = static_cast<int>(parts.cfg.precision.fp8_margin);
  if (opt.gather_fp8) {   // one scale per FP8 layer's weights: q|k|v, o, w1|w3, w2 (model/fp8_layers.h)
    const model::ParamIndex index(model::ModelDims::from(parts.cfg.model));
    for (int l = 0; l < parts.layers; ++l)
      for (const std::vector<int>& group : model::fp8_weight_groups(index.block(l))) {
        std::vector<int> local;
        for (int i : group) local.push_back(store_.local_index(i));
        opt.fp8_groups.push_back(std::move(local));
      }
  }
  fsdp_ = std::make_unique<FullyShardedDataParallel>(store_, *parts.dp, *parts.dp_host, parts.cfg.optim, opt,
                                                     parts.cfg.run.seed, parts.rt);
  if (tp_) {
    // FSDP over the dp axis of a dp x tp mesh: the shards' norm sums are summed over dp by FSDP,
    // then over the tp slices here.
    fsdp_->set_norm_reducer([this](std::vector<double>& sums) {
      tp_->sum_param_norms(store_.infos(), optim::Optimizer::kNormSlots, sums);
    });
  }
}

FsdpStrategy::~FsdpStrategy() = default;

double FsdpStrategy::grad_sum_squares(Context& ctx) { return sharded_sum_squares(ctx, *fsdp_); }

}  // namespace lmscale::parallel
