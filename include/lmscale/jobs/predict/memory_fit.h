#pragma once
// Does a run fit in memory? Before any output is created, the accounting job's prediction of the
// bytes one rank holds at its peak (jobs/predict/accounting.h) is compared with the memory this rank can
// have: free device memory on CUDA, or on CPU the host's available memory (MemAvailable, and the
// cgroup limit where one is set) shared by the ranks of the node. A run that cannot fit is refused
// with exit 2 (UsageError) instead of dying in an allocation minutes later.
#include <cstdint>
#include <optional>
#include <string>

#include "lmscale/io/config.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::jobs {

// The memory one rank can use: bytes, and where they come from, as the end of a sentence ("are
// free on GPU 0 (...)", "are available in host memory (MemAvailable in /proc/meminfo)").
struct MemoryBudget {
  double bytes = 0;
  std::string source;
};

// Predicted peak bytes per rank for the jobs that run the model (train, bench-model; by
// bench.mode: forward holds no gradients or optimizer state, forward-backward no optimizer
// state), the largest components first in `detail`; nullopt for other jobs.
struct MemoryNeed {
  double bytes = 0;
  std::string detail;   // "activations 5.8 TiB, logits 12 GiB, ..."
};
std::optional<MemoryNeed> predicted_need(const Config& cfg, int world, const std::string& device_name);

// The problem (one line naming the keys and the fix) when `need_per_rank` x `ranks_sharing`
// exceeds `budget`, else nullopt. Pure: unit-tested without a machine of that size.
std::optional<std::string> memory_fit_problem(const MemoryNeed& need_per_rank, int ranks_sharing,
                                              const MemoryBudget& budget, const Config& cfg);

// A floor of the bytes per rank, computed arithmetically (nothing allocated in proportion to the
// model): the parameter count from the [model] keys times 4 bytes of fp32 master weights, plus 4
// of fp32 gradients when training, divided over all `world` ranks (the most any layout shards
// them). Checked before the detailed prediction, whose replay grows with model.num_layers.
// nullopt for jobs that do not build the model.
std::optional<MemoryNeed> parameter_floor(const Config& cfg, int world);
// The problem (one line naming model.num_layers and the other shape keys, the bytes and the
// budget) when the floor x `ranks_sharing` exceeds `budget`, else nullopt. Pure.
std::optional<std::string> parameter_floor_problem(const MemoryNeed& floor, int ranks_sharing,
                                                   const MemoryBudget& budget, const Config& cfg, int world);

// This process's budget: free memory of its GPU (cuda), or the host's available memory (cpu),
// which `ranks_on_node` ranks share. The bytes are infinite when they cannot be read.
MemoryBudget memory_budget(ops::Runtime& rt);

// All of the above for this process; throws UsageError when the run cannot fit.
// What the host can give this node's ranks: MemAvailable, or the cgroup's room where smaller.
MemoryBudget host_memory_budget();

// parallel.offload on a GPU run: the host memory one rank's offloaded optimizer holds
// (parallel/offloaded_shards.h for fsdp: master, m, v of the shard; optim/host_adamw.h for one
// process and zero1/zero2: m, v and the fp32 staging of parameters, gradients and the 16-bit copy).
// nullopt without offload or on CPU ranks (their state is host memory already, counted above).
std::optional<MemoryNeed> offload_host_need(const Config& cfg, int world, bool cuda);

void check_memory_fits(const Config& cfg, int world, int ranks_on_node, ops::Runtime& rt);

// "1.50 GiB", "5.82 TiB", "512 B".
std::string format_bytes(double bytes);

}  // namespace lmscale::jobs
