#pragma once
// Runs the job named by run.job; resolves the run-time choices of a deck (device=auto,
// backend=auto, dp=0) once MPI and CUDA are up.
#include <string>

#include "lmscale/comm/types.h"
#include "lmscale/io/config.h"
#include "lmscale/jobs/job_env.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::jobs {

// device auto -> cuda when built with CUDA and a GPU is visible, else cpu; backend auto -> nccl
// on cuda, mpi on cpu; dp 0 -> world / (tp*pp). Throws UsageError for impossible requests
// (device=cuda without a GPU, nccl on cpu). run.job = accounting: parallel.device becomes the
// planned run's (accounting.device; a cuda deck needs no GPU here) and accounting.device stays
// auto only when it means the GPU this process sees.
Config resolve_runtime(const Config& cfg, int world_size);
// Where this process computes: parallel.device, except that the accounting job runs on the CPU
// unless it reads the visible GPU's properties (accounting.device = auto after resolve_runtime).
Device process_device(const Config& resolved);
// precision.mode = fp8 on a CUDA device needs FP8 tensor cores on Hopper (compute capability
// 9.x): a UsageError naming precision.mode otherwise. The CPU runs fp8 as the exact emulation;
// the jobs that only predict a run are not refused.
void check_device_precision(const Config& resolved, const ops::Runtime& rt);
// --print-config: the resolved deck and the process layout.
std::string describe_run(const Config& cfg, int world_size);
// The world communicator's backend of a resolved deck (parallel.backend, auto resolved).
comm::Backend world_backend(const Config& cfg);
int run_job(JobEnv& env);

}  // namespace lmscale::jobs
