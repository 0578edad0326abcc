#include "lmscale/parallel/strategy.h"

#include "lmscale/core/error.h"
#include "lmscale/model/model_dims.h"
#include "lmscale/ops/ops.h"
#include "lmscale/parallel/expert_parallel_strategy.h"
#include "lmscale/parallel/fsdp_strategy.h"
#include "lmscale/parallel/replicated_strategy.h"
#include "lmscale/parallel/sharded_optimizer.h"
#include "lmscale/parallel/tensor_parallel.h"
#include "lmscale/parallel/zero_strategy.h"

namespace lmscale::parallel {

std::unique_ptr<Strategy> make_strategy(const StrategyParts& parts) {
  if (parts.spec.ep > 1) {
    // Expert parallelism: the data-parallel strategy over the expert_dp group, wrapped.
    LMSCALE_CHECK(parts.ep && parts.dp_host, "parallel.ep = {} needs the ep and dp groups", parts.spec.ep);
    StrategyParts inner = parts;
    inner.spec = parts.spec.gradient_group_spec();
    inner.dp = parts.expert_dp;
    inner.dp_host = parts.expert_dp_host;
    inner.dp_rank = parts.expert_dp_rank;
    inner.ep = nullptr;
    return std::make_unique<ExpertParallelStrategy>(parts, make_strategy(inner), *parts.ep, *parts.dp_host);
  }
  // The one mapping from the deck's parallel.zero to an implementation (ZeRO and FSDP act only
  // with more than one data-parallel rank: Spec::sharded_optimizer).
  if (parts.spec.fsdp()) return std::make_unique<FsdpStrategy>(parts);
  if (parts.spec.sharded_optimizer()) return std::make_unique<ZeroStrategy>(parts);
  return std::make_unique<ReplicatedStrategy>(parts);
}

bool step_casts_fp8_weights(const Config& cfg, const Spec& spec, std::int64_t grad_accum, Device device) {
  const PrecisionConfig& pr = cfg.precision;
  const model::ModelDims dims = model::ModelDims::from(cfg.model);
  return pr.mode == PrecisionMode::fp8 && pr.fp8_scaling == Fp8Scaling::delayed &&
         pr.fp8_weight_casts == Fp8WeightCastSite::optimizer && device == Device::cuda && grad_accum == 1 &&
         spec.tp == 1 && spec.pp == 1 && spec.ep == 1 && !spec.sharded_optimizer() &&
         spec.offload == OffloadMode::none && !cfg.parallel.overlap_optimizer &&
         cfg.optim.name == OptimizerName::adamw && dims.d_model % 64 == 0 && dims.d_ff % 64 == 0 &&
         (cfg.run.job != JobKind::bench_model || cfg.bench.mode == BenchMode::train_step);
}

void Strategy::set_fp8_weight_casts(model::Fp8WeightCasts*) {
  throw Error("this data-parallel layout does not cast the FP8 weights in its optimizer step "
              "(parallel::step_casts_fp8_weights)");
}

Tensor Strategy::grad_square_parts(Context&) {
  throw Error("the gradient norm of this layout is not kept on the device (train.cuda_graphs runs one process)");
}

std::vector<float> Strategy::master_parameters(Context& ctx) {
  settle();
  LMSCALE_CHECK(store_.master_dtype() == DType::f32, "master_parameters: fp32 master weights only");
  std::vector<float> h(static_cast<std::size_t>(store_.numel()));
  Tensor dst = Tensor::view(h.data(), {store_.numel()}, DType::f32, Device::cpu);
  ops::copy(ctx, store_.flat_params(), dst);
  return h;
}

void Strategy::set_master_parameters(Context& ctx, const std::vector<float>& values) {
  settle();
  LMSCALE_CHECK(static_cast<std::int64_t>(values.size()) == store_.numel(), "set_master_parameters: {} values for {}",
                values.size(), store_.numel());
  Tensor src = Tensor::view(const_cast<float*>(values.data()), {store_.numel()}, DType::f32, Device::cpu);
  store_.write_master(ctx, src);   // (and the working copy; without a whole master the strategy's own master too)
}

double Strategy::sharded_sum_squares(Context& ctx, ShardedOptimizer& sharded) const {
  const double sq = sharded.grad_sum_squares(ctx);
  if (!tp_) return sq;
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  for (const auto& p : store_.infos())
    if (p.split_dim < 0) ranges.emplace_back(p.offset, p.numel);
  return tp_->global_sum_squares(sq, sharded.grad_sum_squares_in(ctx, ranges));
}

bool Strategy::tp_replicated(const model::ParamInfo& p) const { return tp_ && tp_->degree() > 1 && p.split_dim < 0; }

std::pair<std::int64_t, std::int64_t> Strategy::writer_slice(const model::ParamInfo& p) const {
  const int tp = tp_ ? tp_->degree() : 1, tp_rank = tp_ ? tp_->split().rank : 0;
  const bool rep = tp_replicated(p);
  return slice_of(p.numel, rep ? dp_rank_ * tp + tp_rank : dp_rank_, rep ? spec_.dp * tp : spec_.dp);
}

}  // namespace lmscale::parallel
