#include "lmscale/jobs/predict/cost_estimate.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/io/results_attr.h"
#include "lmscale/model/model_dims.h"

namespace lmscale::jobs {

CostEstimate estimate_cost(const CostInputs& in) {
  CostEstimate e;
  e.flops = in.tokens * in.flops_per_token;
  const double rate = in.gpus * in.peak_flops * in.mfu;
  e.compute_h = rate > 0 ? e.flops / rate / 3600.0 : 0.0;
  // A checkpoint every interval and one at the end; 1e-9 keeps an exact multiple from rounding up.
  if (in.checkpoint_interval_h > 0) e.checkpoints = std::ceil(e.compute_h / in.checkpoint_interval_h - 1e-9);
  if (in.checkpoint_bytes_per_s > 0) e.checkpoint_write_s = in.state_bytes / in.checkpoint_bytes_per_s;
  e.checkpoint_h = e.checkpoints * e.checkpoint_write_s / 3600.0;
  // First order: preemptions during the redone work are not counted again (rate x rework << 1).
  e.preemptions = in.preemptions_per_gpu_hour * in.gpus * (e.compute_h + e.checkpoint_h);
  // Preemptions arrive uniformly within an interval, so on average half an interval since the
  // last checkpoint is lost; without checkpoints, half of the run.
  e.lost_per_preemption_h =
      (in.checkpoint_interval_h > 0 ? in.checkpoint_interval_h : e.compute_h + e.checkpoint_h) / 2.0 + in.restart_h;
  e.rework_h = e.preemptions * e.lost_per_preemption_h;
  e.wall_h = e.compute_h + e.checkpoint_h + e.rework_h;
  e.gpu_hours = in.gpus * e.wall_h;
  e.price_per_gpu_hour = in.price_per_gpu_hour * (1.0 - in.spot_discount);
  e.cost = e.gpu_hours * e.price_per_gpu_hour;
  return e;
}

CostInputs cost_inputs(const Config& cfg, int world, double peak_flops) {
  const auto& c = cfg.cost;
  const auto dims = model::ModelDims::from(cfg.model);
  const auto& p = cfg.parallel;
  const double layout = static_cast<double>(p.dp > 0 ? p.dp * p.tp * p.pp : std::max(world, 1));
  CostInputs in;
  in.tokens = c.tokens;
  in.flops_per_token = dims.train_flops_per_token(dims.context);
  in.gpus = c.gpus > 0 ? static_cast<double>(c.gpus) : layout;
  in.peak_flops = peak_flops;
  in.mfu = c.mfu > 0 ? c.mfu : (c.mfu_from.empty() ? 0.0 : io::read_bench_mfu("cost.mfu_from", c.mfu_from));
  in.state_bytes = 12.0 * static_cast<double>(dims.parameter_count());
  in.checkpoint_bytes_per_s = c.checkpoint_gbps * 1e9;
  in.checkpoint_interval_h = c.checkpoint_interval_h;
  in.preemptions_per_gpu_hour = c.preemptions_per_gpu_hour;
  in.restart_h = c.restart_minutes / 60.0;
  in.price_per_gpu_hour = c.price_per_gpu_hour;
  in.spot_discount = c.spot_discount;
  return in;
}

}  // namespace lmscale::jobs
