#pragma once
// Per-phase memory prediction of a deck (issue 21): what one rank's allocator holds at the peak of
// each phase the job runs, under the names the allocator's tracker gives its phases
// (/memory/peaks): `init` (parameters, optimizer state, flat gradient buffers), `forward` (a
// forward-only pass), `forward_backward` (forward and backward of a train step, with the
// gradients the backward allocates) and `optimizer` (gradient synchronisation and the AdamW step).
// A bench mode runs init + forward (forward), init + forward_backward (forward-backward) or
// init + forward_backward + optimizer (train-step); its predicted peak is the largest of those.
//
// One process, DDP, zero1/zero2 and tensor parallelism are predicted by replaying the model's
// allocations (src/jobs/memory_model.cpp follows transformer.cpp tensor by tensor: what the
// forward keeps for the backward under each checkpointing policy, what the backward allocates and
// frees block by block, when each gradient bucket is allocated). FSDP and pipeline stages add
// their own terms to that replay (gathered units; microbatches in flight) and are coarser.
#include <string>
#include <vector>

#include "lmscale/io/config.h"
#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {

struct PhasePrediction {
  std::string phase;   // init, forward, forward_backward, optimizer (as in /memory/peaks)
  double bytes = 0;    // per rank
};

struct MemoryPhases {
  std::vector<PhasePrediction> phases;   // the phases the job's mode runs, in order
  double peak = 0;                       // max over `phases`
  std::string layout;                    // which model was used (one process, ddp, zero2, ...)
};

// The phases a bench mode runs ("forward", "forward-backward", "train-step"; train runs
// train-step). cuda: count cuBLASLt's 32 MiB workspace and flash attention's backward
// workspaces, as the device runs allocate them (sizes as requested: what the tracker counts).
MemoryPhases predict_memory_phases(const Config& cfg, int world, bool cuda);
// The mode a job runs: bench.mode for bench-model, train-step otherwise.
std::string job_mode(const Config& cfg);
// bench-model: /bench_model/memory_prediction (phase, predicted_bytes, measured_bytes, error), one
// row per phase of the mode, against the allocator's phase peaks; returns the predicted peak.
double write_memory_prediction(JobEnv& env);

}  // namespace lmscale::jobs
