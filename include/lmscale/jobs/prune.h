#pragma once
#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {
// Job `prune` (docs/recipes.md "Pruning"): iterative global magnitude pruning of a weights file,
// unstructured (L1) or structured (FFN units, L2), fixed or loss-guided schedule, with
// prune.finetune_steps masked training steps between rounds; a table of parameters kept vs
// validation loss per round (/prune/rounds) and the pruned weights (prune.output).
int run_prune(JobEnv& env);
}  // namespace lmscale::jobs
