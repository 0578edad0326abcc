#pragma once
// Failures that some ranks see and others do not (a damaged file one rank reads, a full disk one
// rank writes to) must end every rank the same way, or the others wait in the next collective.
#include <functional>

#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {

// Runs `work` on every rank. If it throws on any rank, every rank throws: AgreedUsageError when the
// lowest failing rank's exception was one (or `as_usage`), else Error, with that rank's message
// (prefixed "rank R: " when R > 0). Collective over the world.
void agree_on_failure(JobEnv& env, const std::function<void()>& work, bool as_usage);

}  // namespace lmscale::jobs
