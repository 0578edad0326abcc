// train.cuda_graphs against the job, the device, the layout and the modes a captured step cannot
// hold (docs/architecture.md §5, "The captured step"). Each failure is one UsageError naming
// train.cuda_graphs and the conflicting key (exit 2). A device = auto that resolves to the CPU is
// refused where the device is known (jobs/dispatch.cpp).
#include <fmt/format.h>

#include "deck_validate.h"
#include "lmscale/core/error.h"

namespace lmscale::io::detail {

namespace {

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw UsageError(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace

void check_cuda_graphs(const Config& c, int world_size) {
  if (!c.train.cuda_graphs) return;
  const auto& p = c.parallel;
  if (c.run.job != JobKind::train && c.run.job != JobKind::bench_model)
    fail("train.cuda_graphs = true captures the train step of run.job = train and bench-model, not run.job = {}; set "
         "train.cuda_graphs = false",
         c.run.job);
  if (c.run.job == JobKind::bench_model && c.bench.mode != BenchMode::train_step)
    fail("train.cuda_graphs = true captures the whole train step, but bench.mode = {} times part of it; set "
         "bench.mode = train-step or train.cuda_graphs = false",
         c.bench.mode);
  if (p.device == DeviceChoice::cpu)
    fail("train.cuda_graphs = true needs a CUDA device but parallel.device = cpu; set train.cuda_graphs = false or "
         "parallel.device = cuda");
  // What varies per step inside these modes lives on the host (collectives and their waits on
  // other threads, host-side AdamW, MoE routing counts read back, the layer-wise trust ratios
  // read back): a replayed graph would repeat step one's values.
  const auto refuse = [](const std::string& key, const std::string& value, const char* why, const std::string& fix) {
    fail("train.cuda_graphs = true with {} = {}: {}; set {} or train.cuda_graphs = false", key, value, why, fix);
  };
  if (p.tp > 1)
    refuse("parallel.tp", std::to_string(p.tp), "the captured step runs one process on one GPU", "parallel.tp = 1");
  if (p.pp > 1)
    refuse("parallel.pp", std::to_string(p.pp), "the captured step runs one process on one GPU", "parallel.pp = 1");
  if (p.ep > 1)
    refuse("parallel.ep", std::to_string(p.ep), "the captured step runs one process on one GPU", "parallel.ep = 1");
  if (p.dp > 1)
    refuse("parallel.dp", std::to_string(p.dp), "the captured step runs one process on one GPU", "parallel.dp = 1");
  if (world_size > 1)
    fail("train.cuda_graphs = true runs one process on one GPU, but the MPI world has {} ranks; launch one rank or set "
         "train.cuda_graphs = false",
         world_size);
  if (p.offload != OffloadMode::none)
    refuse("parallel.offload", fmt::format("{}", p.offload), "the offloaded update runs on host threads",
           "parallel.offload = none");
  if (p.overlap_optimizer)
    refuse("parallel.overlap_optimizer", "true", "the overlapped update leaves work in flight across steps",
           "parallel.overlap_optimizer = false");
  if (c.model.moe_experts > 0)
    refuse("model.moe_experts", std::to_string(c.model.moe_experts),
           "MoE routing reads its expert counts back to the host every step", "model.moe_experts = 0");
  if (c.optim.name != OptimizerName::adamw)
    refuse("optim.name", fmt::format("{}", c.optim.name),
           "only AdamW reads its per-step scalars from device memory (SGD's, LARS's and LAMB's are host values)",
           "optim.name = adamw");
}

}  // namespace lmscale::io::detail
