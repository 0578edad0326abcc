#include "lmscale/jobs/dispatch.h"

#include <fmt/format.h>

#include <algorithm>

#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"
#include "lmscale/jobs/predict/accounting.h"
#include "lmscale/jobs/bench_attention.h"
#include "lmscale/jobs/bench_collectives.h"
#include "lmscale/jobs/bench_gemm.h"
#include "lmscale/jobs/bench_model.h"
#include "lmscale/jobs/resilience/oom_report.h"
#include "lmscale/jobs/plan/calibrate_job.h"
#include "lmscale/jobs/plan/plan_job.h"
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
// Deck values that belong to the public schema (docs/deck.md) but whose modes this version does not
// build yet: refused up front rather than silently ignored.
void reject_unbuilt_modes(const Config& c) {
  if (predicts_only(c.run.job)) return;   // accounting and plan compute, they do not run the mode
  // (Nothing at present: the single-file checkpoint gathers parameters and moments over tp and pp,
  // Trainer::to_full_layout, so it works with pipeline stages too.)
  (void)c;
}
}  // namespace

namespace {
// run.job = accounting plans a run on accounting.device, not on this machine: parallel.device
// becomes the planned run's device, and accounting.device stays auto only when it names the GPU
// this process sees (planned_device.h). Without a GPU, a cuda deck plans for an H100 80GB.
void resolve_planned_device(Config& c, int gpus) {
  TargetDevice& target = c.accounting.device;
  if (target == TargetDevice::automatic) {
    if (c.parallel.device == DeviceChoice::cpu || (c.parallel.device == DeviceChoice::automatic && gpus == 0))
      target = TargetDevice::cpu;
    else if (gpus == 0)
      target = TargetDevice::h100_80gb;
  }
  c.parallel.device = target == TargetDevice::cpu ? DeviceChoice::cpu : DeviceChoice::cuda;
}
}  // namespace

Config resolve_runtime(const Config& in, int world) {
  Config c = in;
  reject_unbuilt_modes(c);
  const int gpus = cuda_device_count();
  if (c.run.job == JobKind::accounting) resolve_planned_device(c, gpus);
  // The planner plans a GPU run on the cluster of plan.cluster, whatever this machine has.
  if (c.run.job == JobKind::plan) c.parallel.device = DeviceChoice::cuda;
  if (c.parallel.device == DeviceChoice::automatic) c.parallel.device = gpus > 0 ? DeviceChoice::cuda : DeviceChoice::cpu;
  if (c.parallel.device == DeviceChoice::cuda && gpus == 0 && !predicts_only(c.run.job))
    throw UsageError("parallel.device=cuda but no CUDA device is visible (or lmscale was built without CUDA); use parallel.device=cpu");
  if (c.parallel.backend == BackendChoice::automatic)
    c.parallel.backend = c.parallel.device == DeviceChoice::cuda ? BackendChoice::nccl : BackendChoice::mpi;
  if (c.parallel.backend == BackendChoice::nccl && c.parallel.device != DeviceChoice::cuda)
    throw UsageError("parallel.backend=nccl needs parallel.device=cuda; use parallel.backend=mpi on CPUs");
  // (The interleaved schedule runs on nccl too: each communication point is one grouped exchange
  // issued in an order both neighbours agree on; parallel/interleaved_schedule.h.)
  if (c.parallel.dp == 0) c.parallel.dp = world / (c.parallel.tp * c.parallel.pp);
  if (c.parallel.device == DeviceChoice::cpu && !predicts_only(c.run.job) &&
      c.precision.mode != PrecisionMode::fp32 && c.precision.mode != PrecisionMode::fp8)
    throw UsageError(fmt::format("precision.mode={} needs a CUDA device (mixed precision is GPU-only); use precision.mode=fp32 on CPUs", c.precision.mode));
  // parallel.device = cpu is refused with the deck (io/deck_cuda_graphs.cpp); auto may find no GPU.
  if (c.parallel.device == DeviceChoice::cpu && c.train.cuda_graphs && !predicts_only(c.run.job))
    throw UsageError("train.cuda_graphs = true needs a CUDA device, but none is visible (or lmscale was built without "
                     "CUDA); set train.cuda_graphs = false on CPUs");
  // CPU attention takes fp32 (and fp64) only: refused here, not by an internal check mid-run.
  if (c.parallel.device == DeviceChoice::cpu && c.run.job == JobKind::bench_attention)
    for (FloatType d : c.bench.dtypes)
      if (d != FloatType::fp32)
        throw UsageError(fmt::format("bench.dtypes item {} needs a CUDA device (attention on CPUs runs in fp32); set "
                                     "bench.dtypes = fp32 on CPUs, or parallel.device = cuda",
                                     d));
  // CPU GEMMs take fp32 (and fp64) operands; fp8 runs as the CPU emulation around fp32.
  if (c.parallel.device == DeviceChoice::cpu && c.run.job == JobKind::bench_gemm)
    for (GemmPrecision p : c.bench.gemm_precisions)
      if (p == GemmPrecision::bf16)
        throw UsageError("bench.gemm_precisions item bf16 needs a CUDA device (GEMMs on CPUs run in fp32, or fp8 as "
                         "its emulation); set bench.gemm_precisions = fp32,fp8 on CPUs, or parallel.device = cuda");
  c.resolved = io::to_ini(c);
  return c;
}

Device process_device(const Config& resolved) {
  if (resolved.run.job == JobKind::accounting)
    return resolved.accounting.device == TargetDevice::automatic ? Device::cuda : Device::cpu;
  if (resolved.run.job == JobKind::plan) return Device::cpu;   // the planner computes on the host
  return resolved.parallel.device == DeviceChoice::cuda ? Device::cuda : Device::cpu;
}

void check_device_precision(const Config& resolved, const ops::Runtime& rt) {
  if (rt.device() != Device::cuda || predicts_only(resolved.run.job)) return;
  const int cc = rt.compute_capability();
  const auto& gp = resolved.bench.gemm_precisions;
  if (resolved.run.job == JobKind::bench_gemm && cc / 10 != 9 &&
      std::find(gp.begin(), gp.end(), GemmPrecision::fp8) != gp.end())
    throw UsageError(fmt::format("bench.gemm_precisions item fp8 needs a Hopper GPU (compute capability 9.x, e.g. "
                                 "H100, H200), but {} has compute capability {}.{}; drop fp8 from "
                                 "bench.gemm_precisions",
                                 rt.device_name(), cc / 10, cc % 10));
  if (resolved.precision.mode != PrecisionMode::fp8) return;
  if (cc / 10 != 9)
    throw UsageError(fmt::format("precision.mode = fp8 needs a Hopper GPU (compute capability 9.x, e.g. H100, H200), "
                                 "but {} has compute capability {}.{}; set precision.mode = bf16",
                                 rt.device_name(), cc / 10, cc % 10));
}

std::string describe_run(const Config& cfg, int world) {
  return fmt::format("# lmscale resolved configuration ({} ranks)\n{}", world, io::to_ini(cfg));
}

comm::Backend world_backend(const Config& cfg) {
  switch (cfg.parallel.backend) {
    case BackendChoice::mpi: return comm::Backend::mpi;
    case BackendChoice::nccl: return comm::Backend::nccl;
    case BackendChoice::automatic: break;
  }
  throw Error("world_backend: parallel.backend = auto was not resolved (resolve_runtime)");
}

int run_job(JobEnv& env) {
  switch (env.cfg.run.job) {
    case JobKind::bench_model: return with_oom_report(env, [&] { return run_bench_model(env); });
    case JobKind::train: return with_oom_report(env, [&] { return run_train(env); });
    case JobKind::bench_attention: return run_bench_attention(env.cfg, env.rt, env.out);
    case JobKind::bench_collectives: return run_bench_collectives(env);
    case JobKind::bench_gemm: return run_bench_gemm(env.cfg, env.rt, env.out);
    case JobKind::accounting: return run_accounting(env);
    case JobKind::prune: return with_oom_report(env, [&] { return run_prune(env); });
    case JobKind::plan: return run_plan(env);
    case JobKind::calibrate: return run_calibrate(env);
  }
  throw UsageError(fmt::format("run.job={} is not a job", env.cfg.run.job));
}

}  // namespace lmscale::jobs
