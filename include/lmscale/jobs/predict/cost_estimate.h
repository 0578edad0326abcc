#pragma once
// What a training run of D tokens costs (docs/recipes.md "Cost"): GPU-hours and money from the
// FLOPs (docs/internals.md "FLOPs per trained token": 6 x matmul parameters + 12 L T d per
// token), the GPUs' peak and an MFU, plus the time spent writing checkpoints and the work
// expected to be redone after preemptions (spot instances).
#include <string>

#include "lmscale/io/config.h"

namespace lmscale::jobs {

struct CostInputs {
  double tokens = 0;                   // D, tokens trained on
  double flops_per_token = 0;          // training FLOPs per token
  double gpus = 1;                     // devices running the job
  double peak_flops = 0;               // dense peak per device (FLOP/s)
  double mfu = 0;                      // model FLOPs utilisation in (0, 1]
  double state_bytes = 0;              // one checkpoint: fp32 weights + AdamW m, v = 12 B x parameters
  double checkpoint_bytes_per_s = 0;   // aggregate write bandwidth
  double checkpoint_interval_h = 0;    // wall hours of compute between checkpoints; 0 = none
  double preemptions_per_gpu_hour = 0; // expected preemptions per GPU-hour (spot)
  double restart_h = 0;                // to get machines back and load the checkpoint, per preemption
  double price_per_gpu_hour = 0;       // on-demand price
  double spot_discount = 0;            // fraction off the price, in [0, 1)
};

struct CostEstimate {
  double flops = 0;            // tokens x flops_per_token
  double compute_h = 0;        // flops / (gpus x peak x mfu), in hours
  double checkpoints = 0;      // ceil(compute_h / interval): one per interval, the last at the end
  double checkpoint_write_s = 0;   // state_bytes / bandwidth
  double checkpoint_h = 0;     // checkpoints x write time
  double preemptions = 0;      // rate x gpus x (compute_h + checkpoint_h)
  double lost_per_preemption_h = 0;   // half an interval (half the run without checkpoints) + restart
  double rework_h = 0;         // preemptions x lost_per_preemption_h
  double wall_h = 0;           // compute + checkpoints + rework
  double gpu_hours = 0;        // gpus x wall_h
  double price_per_gpu_hour = 0;   // after the spot discount
  double cost = 0;             // gpu_hours x price_per_gpu_hour
};

CostEstimate estimate_cost(const CostInputs& in);

// The inputs from a deck's [cost] keys for `cfg`'s model: gpus = cost.gpus or the deck's layout
// (dp x tp x pp on `world` ranks), MFU = cost.mfu or the /bench_model mfu attribute of
// cost.mfu_from. Throws UsageError naming cost.mfu_from when that file holds no usable MFU.
CostInputs cost_inputs(const Config& cfg, int world, double peak_flops);

}  // namespace lmscale::jobs
