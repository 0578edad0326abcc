#pragma once
// Job `calibrate` (docs/planner.md, "Calibration"): measures the rates the planner's step model
// reads on this machine's device (GEMM FLOP/s by shape, attention, elementwise and optimizer
// bandwidth, the launch gap) and, over the launched ranks, the alpha and beta of the collectives
// (the bench-collectives timing), and writes them as a calibration file (calibrate.output) and as
// tables of the results file.
#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {

int run_calibrate(JobEnv& env);

}  // namespace lmscale::jobs
