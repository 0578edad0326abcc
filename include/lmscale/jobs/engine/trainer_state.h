#pragma once
// The trainer's state in the layout-independent form of parallel/state_layout.h, for sharded
// checkpoints: which pieces of which parameters this rank holds and writes, whatever the mode
// (one process, DDP, zero1/zero2, fsdp, tensor parallelism with dp/zero, pipeline stages with
// dp/zero), in the full model's coordinates, and the optimizer step count behind them.
#include <cstdint>
#include <string>

#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/parallel/state_layout.h"

namespace lmscale::jobs {

parallel::StateLayout describe_state(Trainer& trainer);
// AdamW's step count (bias correction) of every optimizer instance the mode has.
std::int64_t optimizer_steps(Trainer& trainer);
void set_optimizer_steps(Trainer& trainer, std::int64_t t);
// "one process", "ddp bucketed (4 ranks)", "zero2 x tp 2 (4 ranks)", "ddp flat x pp 2 (1f1b) (2 ranks)":
// stored in the index.
std::string layout_name(const Trainer& trainer, const Config& cfg, int world);

}  // namespace lmscale::jobs
