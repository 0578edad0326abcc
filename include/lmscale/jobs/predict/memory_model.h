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
// allocations (src/jobs/predict/memory_replay.cpp follows transformer.cpp tensor by tensor: what the
// forward keeps for the backward under each checkpointing policy, what the backward allocates and
// frees block by block, when each gradient bucket is allocated). FSDP adds its gathered units to
// that replay; a pipeline rank replays its own stage's chunks under its schedule
// (src/jobs/predict/memory_model_pipeline.cpp: microbatch activations in flight, the p2p receive buffers,
// the sends kept until the next backward, the inputs and loss sums of all microbatches).
#include <cstdint>
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
// rank: the world rank whose memory is predicted (mesh rank = (pp_idx dp + dp_idx) tp + tp_idx:
// its pipeline stage, its ZeRO shard); -1: the rank with the largest peak (the stage that needs
// the most; memory fit checks and the accounting job).
// Beyond kMaxReplayedLayers blocks the phases are extrapolated from two replays of fewer blocks
// (each phase is affine in the depth once the blocks' pattern repeats; exact up to where
// fixed-size gradient buckets fall), so that any depth is predicted in milliseconds and a few MB
// (issue 36 item 5); except with parallel.stage_layers, which fixes every stage's depth.
MemoryPhases predict_memory_phases(const Config& cfg, int world, bool cuda, int rank = -1);
inline constexpr std::int64_t kMaxReplayedLayers = 2048;
// The block-by-block replay for mesh rank `rank` (>= 0) whatever the depth (what
// predict_memory_phases extrapolates from; memory and time grow with model.num_layers).
MemoryPhases replay_memory_phases(const Config& cfg, int world, bool cuda, int rank);
// The phases of every pipeline stage's first rank (dp 0, tp 0), stage by stage; one entry (rank
// 0) without pipeline parallelism. The tp ranks of a stage predict alike, and dp rank 0 holds
// the largest ZeRO shard (even_split gives the remainder to the first ranks).
std::vector<MemoryPhases> predict_stage_phases(const Config& cfg, int world, bool cuda);
// The mode a job runs: bench.mode for bench-model, train-step otherwise.
BenchMode job_mode(const Config& cfg);
// bench-model: /bench_model/memory_prediction (phase, predicted_bytes, measured_bytes, error), one
// row per phase of the mode, rank 0's prediction against its allocator's phase peaks, and
// /bench_model/memory_prediction_ranks, the same for every rank (a rank column; gathered to rank 0
// over the world's host communicator; collective). Returns this rank's predicted peak.
double write_memory_prediction(JobEnv& env);

}  // namespace lmscale::jobs
