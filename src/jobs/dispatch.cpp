#include "lmscale/jobs/dispatch.h"

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"
#include "lmscale/jobs/accounting.h"
#include "lmscale/jobs/bench_attention.h"
#include "lmscale/jobs/bench_collectives.h"
#include "lmscale/jobs/bench_model.h"
#include "lmscale/jobs/oom_report.h"
#include "lmscale/jobs/prune.h"
#include "lmscale/jobs/train.h"
#ifdef LMSCALE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace lmscale::jobs {

namespace {
int cuda_device_count() {
#ifdef LMSCALE_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}
}  // namespace

namespace {
// Deck values that belong to the public schema (DESIGN §6) but whose modes this version does not
// build yet: refused up front rather than silently ignored.
void reject_unbuilt_modes(const Config& c) {
  if (c.run.job == "accounting") return;   // accounting computes, it does not run the mode
  // (Nothing at present: the single-file checkpoint gathers parameters and moments over tp and pp,
  // Trainer::to_full_layout, so it works with pipeline stages too.)
  (void)c;
}
}  // namespace

Config resolve_runtime(const Config& in, int world) {
  Config c = in;
  reject_unbuilt_modes(c);
  const int gpus = cuda_device_count();
  if (c.parallel.device == "auto") c.parallel.device = gpus > 0 ? "cuda" : "cpu";
  if (c.parallel.device == "cuda" && gpus == 0)
    throw UsageError("parallel.device=cuda but no CUDA device is visible (or lmscale was built without CUDA); use parallel.device=cpu");
  if (c.parallel.backend == "auto") c.parallel.backend = c.parallel.device == "cuda" ? "nccl" : "mpi";
  if (c.parallel.backend == "nccl" && c.parallel.device != "cuda")
    throw UsageError("parallel.backend=nccl needs parallel.device=cuda; use parallel.backend=mpi on CPUs");
  // (The interleaved schedule runs on nccl too: each communication point is one grouped exchange
  // issued in an order both neighbours agree on; parallel/interleaved_schedule.h.)
  if (c.parallel.dp == 0) c.parallel.dp = world / (c.parallel.tp * c.parallel.pp);
  if (c.parallel.device == "cpu" && c.run.job != "accounting" && (c.precision.mode == "bf16" || c.precision.mode == "fp16"))
    throw UsageError(fmt::format("precision.mode={} needs a CUDA device (mixed precision is GPU-only); use precision.mode=fp32 on CPUs", c.precision.mode));
  // CPU attention takes fp32 (and fp64) only: refused here, not by an internal check mid-run.
  if (c.parallel.device == "cpu" && c.run.job == "bench-attention")
    for (const auto& d : c.bench.dtypes)
      if (d != "fp32")
        throw UsageError(fmt::format("bench.dtypes item {} needs a CUDA device (attention on CPUs runs in fp32); set "
                                     "bench.dtypes = fp32 on CPUs, or parallel.device = cuda",
                                     d));
  c.resolved = io::to_ini(c);
  return c;
}

std::string describe_run(const Config& cfg, int world) {
  return fmt::format("# lmscale resolved configuration ({} ranks)\n{}", world, io::to_ini(cfg));
}

int run_job(JobEnv& env) {
  const std::string& job = env.cfg.run.job;
  if (job == "bench-model") return with_oom_report(env, [&] { return run_bench_model(env); });
  if (job == "train") return with_oom_report(env, [&] { return run_train(env); });
  if (job == "bench-attention") return run_bench_attention(env.cfg, env.rt, env.out);
  if (job == "bench-collectives") return run_bench_collectives(env);
  if (job == "accounting") return run_accounting(env);
  if (job == "prune") return with_oom_report(env, [&] { return run_prune(env); });
  throw UsageError(fmt::format("run.job={} is not a job", job));
}

}  // namespace lmscale::jobs
