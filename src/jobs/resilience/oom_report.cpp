#include "lmscale/jobs/resilience/oom_report.h"

#include <new>
#include <string>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/jobs/predict/memory_fit.h"

namespace lmscale::jobs {

namespace {

std::string report(JobEnv& env, const std::string& what) {
  const Config& cfg = env.cfg;
  std::string prediction = "no prediction for this job";
  try {
    if (const auto need = predicted_need(cfg, env.world, env.rt.device_name()))
      prediction = fmt::format("the accounting job predicts {} per rank for this deck ({})", format_bytes(need->bytes),
                               need->detail);
  } catch (const std::exception& e) {
    prediction = fmt::format("no prediction ({})", e.what());
  }
  const MemoryBudget budget = memory_budget(env.rt);
  const std::string key = cfg.run.job == JobKind::train ? "train.batch_size" : "bench.batch_size";
  return fmt::format(
      "{}; {} {}; {}. To fit: train.activation_checkpointing = every-k or selective (activations), "
      "parallel.zero = fsdp or zero2 on more ranks (parameters, gradients, optimizer state), or a smaller {}{}",
      what, format_bytes(budget.bytes), budget.source, prediction, key,
      cfg.run.job == JobKind::train ? " with train.grad_accum to keep the global batch" : "");
}

}  // namespace

int with_oom_report(JobEnv& env, const std::function<int()>& job) {
  try {
    return job();
  } catch (const OutOfMemory& e) {
    throw Error(report(env, e.what()));
  } catch (const std::bad_alloc& e) {
    throw Error(report(env, fmt::format("out of host memory: {}", e.what())));
  }
}

}  // namespace lmscale::jobs
