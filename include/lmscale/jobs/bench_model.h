#pragma once
#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {
// Job `bench-model`: warm-up steps, then timed steps of forward, forward+backward or a full
// train step on random tokens; per-phase mean/std/min/max, tokens/s, MFU, peak memory per phase.
int run_bench_model(JobEnv& env);
}  // namespace lmscale::jobs
