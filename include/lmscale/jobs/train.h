#pragma once
#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {
// Job `train`: steps of the optimizer over synthetic or file tokens, logging loss, LR, gradient
// norm, step time and memory; evaluation; checkpoints; resume; final weights.
int run_train(JobEnv& env);
}  // namespace lmscale::jobs
