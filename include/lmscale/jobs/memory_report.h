#pragma once
// Writes the memory profile of a run: /memory/peaks (peak bytes per phase) and, when recorded,
// /memory/timeline (every allocation event), from the runtime's device allocator.
#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {
void write_memory_report(JobEnv& env);
}  // namespace lmscale::jobs
