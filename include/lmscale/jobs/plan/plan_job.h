#pragma once
// Job `plan` (docs/planner.md): the predicted step time, memory, tokens/s per GPU and MFU of the
// deck's layout and of every layout of plan.gpus GPUs on the plan.cluster cluster, ranked, with the
// best layout's compute per op and communication per collective, and the sweep of predicted
// tokens/s per GPU against the GPU count per layout family. Computes on one process; nothing runs.
#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {

int run_plan(JobEnv& env);

}  // namespace lmscale::jobs
