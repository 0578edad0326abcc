#pragma once
// Memory, communication and FLOP accounting of a deck (docs/architecture.md §5): what one rank holds at the
// peak of a train step (the start of the backward) in lmscale's own layout, the bytes each rank
// moves per step for the data-parallel mode, and the FLOPs per step. The `accounting` job prints
// and stores it; bench-model stores the predicted peak beside the measured one.
#include <cstdint>
#include <string>
#include <vector>

#include "lmscale/io/config.h"
#include "lmscale/jobs/job_env.h"
#include "lmscale/jobs/predict/parallel_bounds.h"

namespace lmscale::jobs {

struct MemoryItem {
  std::string name;     // parameters, gradients, optimizer_state, ...
  double bytes;         // per rank
  std::string formula;  // how it was counted
};

struct Accounting {
  std::int64_t parameters = 0;
  std::int64_t local_batch = 0, seq = 0;
  std::vector<MemoryItem> memory;      // per rank, at the start of the backward
  double peak_bytes = 0;               // sum of `memory`
  double comm_bytes_per_step = 0;      // bytes each rank sends per optimizer step
  std::string comm_formula;
  double flops_per_step = 0;           // all ranks (attention over the full T x T matrix)
  double flops_per_step_causal = 0;    // the same with causal attention halved (model_dims.h)
  double peak_flops = 0;               // per device (0 when the device is unknown)
  double ideal_step_s = 0;             // flops / (ranks * peak)
  // Tensor parallelism: activation bytes each rank sends per step over its tp group.
  double tp_comm_bytes_per_step = 0;
  std::string tp_comm_formula;
  // The degree at which each strategy becomes communication bound (parallel_bounds.h), for the
  // FLOP rate and link bandwidth of the [accounting] keys.
  std::vector<ParallelBound> bounds;
  double analysis_flops = 0, analysis_link_bytes = 0;   // C (FLOP/s) and W (bytes/s) used
  // parallel.offload (docs/parallel.md "CPU offload"): host memory per rank for the offloaded
  // optimizer, and the bytes each rank moves between host and device per step (both directions).
  double host_bytes = 0, host_transfer_bytes_per_step = 0;
  std::string host_formula, host_transfer_formula;
};

// For a resolved config on `world` ranks; device_name picks the peak FLOP/s ("" = H100 SXM).
Accounting account(const Config& cfg, int world, const std::string& device_name);

// A mixture-of-experts model (model.moe_experts > 0; src/jobs/predict/accounting_moe.cpp): its
// parameters (total, used per token, in the experts) and, for parallel.ep on `world` ranks, each
// rank's expert state and the bytes of its dispatch and combine all-to-alls per optimizer step.
struct MoeAccounting {
  std::int64_t total_parameters = 0, active_parameters = 0, expert_parameters = 0;
  std::int64_t ep = 1;
  double expert_state_bytes_per_rank = 0;   // fp32 weights, gradients, AdamW m and v of its experts
  double all_to_all_bytes_per_step = 0;     // bytes each rank sends to other ep ranks per step
  std::string all_to_all_formula;
};
MoeAccounting account_moe(const Config& cfg, int world);
// What one rank's parameter store holds and over how many ranks ZeRO and FSDP shard it
// (docs/parallel.md, "Expert parallelism"): without parallel.ep every parameter, sharded over
// the dp group; with ep > 1 the dense parameters and E/ep of every MoE block's experts, sharded
// over the expert_dp group of dp/ep ranks (the dense ones are then held ep times over the dp
// group). The accounting's formula rows count `held` where a dense model's count P.
struct HeldParameters {
  double held = 0;            // P - Pe + Pe/ep (= P with ep = 1)
  double experts = 0;         // Pe: the parameters of all experts of all MoE blocks
  int ep = 1;
  int shard_ranks = 1;        // dp, or dp/ep under expert parallelism
  std::string held_name;      // "P", or "(P - Pe + Pe/ep)"
  std::string shard_name;     // "N", or "(dp/ep)"
};
HeldParameters held_parameters(const Config& cfg, int world);
// Writes /accounting/moe and prints its lines (rank 0).
void write_moe_accounting(JobEnv& env, const MoeAccounting& a);
// parallel.pp > 1 (src/jobs/predict/accounting_pipeline.cpp): the stage needing the most memory, with
// its microbatches in flight, the bytes sent between stages, and the bubble in the ideal step.
Accounting account_pipeline(const Config& cfg, int world, const std::string& device_name);
int run_accounting(JobEnv& env);

}  // namespace lmscale::jobs
