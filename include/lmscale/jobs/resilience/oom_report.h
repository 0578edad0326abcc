#pragma once
// Out of memory in train or bench-model (docs/checkpoints.md "Exit codes"): the allocator's
// message (bytes requested, in use, free) is extended with the memory free now, the accounting
// job's prediction for the deck, and what to change, so the user can act without a second run.
#include <functional>

#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {

// Runs `job`; an OutOfMemory (or std::bad_alloc) from it becomes an Error (exit 1) with that text.
int with_oom_report(JobEnv& env, const std::function<int()>& job);

}  // namespace lmscale::jobs
