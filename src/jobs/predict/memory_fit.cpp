// Memory fit before any output (include/lmscale/jobs/predict/memory_fit.h): the accounting prediction
// against the memory this rank can have.
#include "lmscale/jobs/predict/memory_fit.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/core/host_memory.h"
#include "lmscale/jobs/predict/accounting.h"
#include "lmscale/jobs/predict/memory_model.h"
#include "lmscale/model/model_dims.h"
#ifdef LMSCALE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace lmscale::jobs {

namespace {

constexpr double kUnknown = std::numeric_limits<double>::infinity();

// ModelDims::parameter_count() in double: the product of absurd keys must not overflow (the fit
// checks run before anything else has judged the sizes).
double parameters_in_double(const model::ModelDims& m) {
  const double V = static_cast<double>(m.vocab), d = static_cast<double>(m.d_model), F = static_cast<double>(m.d_ff),
               L = static_cast<double>(m.layers), moe = static_cast<double>(m.moe_block_count()),
               E = static_cast<double>(m.moe_experts), Fe = static_cast<double>(m.moe_dff);
  return 2 * V * d + L * (4 * d * d + 2 * d) + (L - moe) * 3 * d * F + moe * E * (d + 3 * d * Fe) + d;
}

// Room left under the cgroup's memory limit, when one is set.
std::optional<double> cgroup_room() {
  if (const auto c = cgroup_memory()) return std::max(0.0, c->limit - c->used);
  return std::nullopt;
}

}  // namespace

std::string format_bytes(double bytes) {
  if (!std::isfinite(bytes)) return "unknown";
  if (bytes >= 1024.0 * 1024 * 1024 * 1024 * 1024) return fmt::format("{:.3g} bytes", bytes);   // past PiB
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

std::optional<MemoryNeed> predicted_need(const Config& cfg, int world, const std::string& device_name) {
  const bool bench = cfg.run.job == JobKind::bench_model;
  if (!bench && cfg.run.job != JobKind::train) return std::nullopt;
  // The peak of the phases the job runs (memory_model.h): a forward-only bench never holds
  // gradients, a train step's optimizer phase holds them beside the AdamW state.
  const MemoryPhases phases = predict_memory_phases(cfg, world, !device_name.empty());
  MemoryNeed need;
  need.bytes = phases.peak;
  for (const auto& p : phases.phases)
    need.detail += fmt::format("{}{} {}", need.detail.empty() ? "peak of phases: " : ", ", p.phase, format_bytes(p.bytes));
  return need;
}

std::optional<std::string> memory_fit_problem(const MemoryNeed& need, int ranks_sharing, const MemoryBudget& budget,
                                              const Config& cfg) {
  const double total = need.bytes * std::max(1, ranks_sharing);
  if (!(total > budget.bytes)) return std::nullopt;
  const std::string batch = cfg.run.job == JobKind::train ? "train.batch_size" : "bench.batch_size";
  return fmt::format(
      "the run does not fit in memory: for run.job = {} the accounting job predicts {} per rank ({}){}, but only {} "
      "{}; reduce {} or model.context_length, or choose a smaller model (model.size, model.d_model, "
      "model.num_layers){} (`lmscale DECK --run.job=accounting` prints the prediction)",
      cfg.run.job, format_bytes(need.bytes), need.detail,
      ranks_sharing > 1 ? fmt::format(", {} for the {} ranks sharing it", format_bytes(total), ranks_sharing) : "",
      format_bytes(budget.bytes), budget.source.empty() ? std::string("are available") : budget.source, batch, cfg.run.job == JobKind::train ? ", or raise train.grad_accum" : "");
}

MemoryBudget memory_budget(ops::Runtime& rt) {
  MemoryBudget b{kUnknown, ""};
  if (rt.device() == Device::cuda) {
#ifdef LMSCALE_WITH_CUDA
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
      int device = 0;
      cudaGetDevice(&device);
      b.bytes = static_cast<double>(free);
      b.source = fmt::format("are free on GPU {} ({}, {} in all)", device, rt.device_name(), format_bytes(static_cast<double>(total)));
    } else {
      cudaGetLastError();
    }
#endif
    return b;
  }
  return host_memory_budget();
}

MemoryBudget host_memory_budget() {
  MemoryBudget b{kUnknown, ""};
  const auto available = meminfo_bytes("MemAvailable");
  const auto room = cgroup_room();
  if (available && (!room || *available <= *room)) {
    b.bytes = *available;
    b.source = "are available in host memory (MemAvailable in /proc/meminfo)";
  } else if (room) {
    b.bytes = *room;
    b.source = "are left under this container's memory limit (cgroup)";
  }
  return b;
}

std::optional<MemoryNeed> parameter_floor(const Config& cfg, int world) {
  const bool train = cfg.run.job == JobKind::train;
  if (!train && cfg.run.job != JobKind::bench_model) return std::nullopt;
  const double params = parameters_in_double(model::ModelDims::from(cfg.model));
  const double bytes_per_param = train ? 8.0 : 4.0;   // fp32 master weights (+ fp32 gradients)
  MemoryNeed floor;
  floor.bytes = bytes_per_param * params / std::max(1, world);
  floor.detail = fmt::format("{:.3g} parameters", params);
  return floor;
}

std::optional<std::string> parameter_floor_problem(const MemoryNeed& floor, int ranks_sharing,
                                                   const MemoryBudget& budget, const Config& cfg, int world) {
  const double total = floor.bytes * std::max(1, ranks_sharing);
  if (!(total > budget.bytes)) return std::nullopt;
  const bool train = cfg.run.job == JobKind::train;
  return fmt::format(
      "the model does not fit in memory: model.num_layers = {} with model.d_model = {}, model.d_ff = {} and "
      "model.vocab_size = {} makes {}, whose fp32 weights{} alone need at least {} per rank{}{}, but only {} {}; "
      "reduce model.num_layers (or model.d_model, model.d_ff, model.vocab_size, model.size) "
      "(`lmscale DECK --run.job=accounting` prints the prediction of a model that fits)",
      cfg.model.num_layers, cfg.model.d_model, cfg.model.d_ff, cfg.model.vocab_size, floor.detail,
      train ? " and gradients" : "", format_bytes(floor.bytes),
      world > 1 ? fmt::format(" (sharded over all {} ranks)", world) : "",
      ranks_sharing > 1 ? fmt::format(", {} for the {} ranks sharing it", format_bytes(total), ranks_sharing) : "",
      format_bytes(budget.bytes), budget.source.empty() ? std::string("are available") : budget.source);
}

std::optional<MemoryNeed> offload_host_need(const Config& cfg, int world, bool cuda) {
  if (!cuda || cfg.parallel.offload == OffloadMode::none) return std::nullopt;
  if (cfg.run.job != JobKind::train && cfg.run.job != JobKind::bench_model) return std::nullopt;
  const double shard = parameters_in_double(model::ModelDims::from(cfg.model)) / std::max(1, world);   // offload runs have tp = pp = 1 (deck checks)
  const bool fsdp = cfg.parallel.zero == ZeroLevel::fsdp;
  // optimizer+params (fsdp): the shard's pinned copy in the compute dtype too.
  const bool host_params = cfg.parallel.offload == OffloadMode::optimizer_params;
  const double e = computes_16bit(cfg.precision.mode, cuda) ? 2.0 : 4.0;
  const double copies = cfg.parallel.offload_delayed_update ? 2.0 : 1.0;   // the delayed update's two pinned copies
  const double bytes_per = host_params ? 12.0 + copies * e : 12.0;
  MemoryNeed need;
  need.bytes = bytes_per * shard;
  need.detail = fmt::format("{:.0f} bytes for each of {:.3g} parameters of this rank's {}", bytes_per, shard,
                            host_params ? (copies > 1 ? "shard: fp32 master, m, v and its two pinned compute-dtype copies"
                                                      : "shard: fp32 master, m, v and its pinned compute-dtype copy")
                            : fsdp ? "shard: fp32 master, m and v"
                                   : "range: fp32 master, m and v");
  return need;
}

void check_memory_fits(const Config& cfg, int world, int ranks_on_node, ops::Runtime& rt) {
  // The host memory an offloaded optimizer needs, against what the node's ranks can share.
  if (const auto host = offload_host_need(cfg, world, rt.device() == Device::cuda)) {
    const MemoryBudget budget = host_memory_budget();
    const double total = host->bytes * std::max(1, ranks_on_node);
    if (total > budget.bytes)
      throw UsageError(fmt::format(
          "the run does not fit in host memory: parallel.offload = {} keeps {} per rank in host memory ({}), {} for "
          "the {} ranks on this node, but only {} {}; spread the ranks over more nodes, or set parallel.offload = none",
          cfg.parallel.offload, format_bytes(host->bytes), host->detail, format_bytes(total), std::max(1, ranks_on_node),
          format_bytes(budget.bytes), budget.source));
  }
  // A GPU belongs to one rank; host memory is shared by the node's ranks.
  const int sharing = rt.device() == Device::cuda ? 1 : ranks_on_node;
  const MemoryBudget budget = memory_budget(rt);
  // First the arithmetic floor: the detailed prediction replays the step layer by layer, and its
  // own memory grows with model.num_layers (issue 36: 24 GB for num_layers = 100000000).
  if (const auto floor = parameter_floor(cfg, world))
    if (auto problem = parameter_floor_problem(*floor, sharing, budget, cfg, world)) throw UsageError(*problem);
  const auto need = predicted_need(cfg, world, rt.device() == Device::cuda ? rt.device_name() : "");
  if (!need) return;
  if (auto problem = memory_fit_problem(*need, sharing, budget, cfg)) throw UsageError(*problem);
}

}  // namespace lmscale::jobs
