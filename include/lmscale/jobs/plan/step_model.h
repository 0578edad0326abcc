#pragma once
// The predicted time of one training step of a deck's layout on a cluster (docs/planner.md, "The
// step model"): compute per op from the calibration's rates (a roofline with measured efficiency
// curves: GEMMs and attention by FLOPs per call, elementwise kernels and the optimizer by bytes),
// each collective from the alpha-beta model on the link its group uses, the pipeline bubble, and
// the overlap rules of the strategy (parallel::Spec's gradient_timing). FLOP counts follow
// model::ModelDims and the tensor-parallel collectives jobs/predict/parallel_bounds.h, as the
// accounting counts them.
#include <cstdint>
#include <string>
#include <vector>

#include "lmscale/io/config.h"
#include "lmscale/jobs/plan/calibration.h"
#include "lmscale/jobs/plan/cluster.h"

namespace lmscale::jobs::plan {

// Seconds of one kind of work per step on the slowest rank (all its micro-batches).
struct OpTime {
  std::string op;        // "gemm qkv", "attention", "elementwise", "recompute", "optimizer", ...
  double flops = 0;      // per step on this rank (0 for memory-bound work)
  double bytes = 0;      // memory traffic per step on this rank (0 for GEMMs and attention)
  double seconds = 0;
};

// One collective of the step: how often it runs, its size, its time and how much of it is exposed.
struct CommTime {
  std::string collective;   // "all-reduce", "reduce-scatter", "all-gather", "all-to-all", "p2p"
  std::string axis;         // "dp", "tp", "pp", "ep"
  std::string purpose;      // "gradients", "fsdp unit gathers", "activations", ...
  std::string algorithm;    // "ring", "tree", "p2p"
  bool inter_node = false;
  double calls = 0;         // per step
  double bytes_per_call = 0;
  double seconds = 0;       // all calls
  double exposed_s = 0;     // of `seconds`, on the critical path
  double contention_s = 0;  // compute slowed beside the overlapped part (calibration's contention)
};

struct StepPrediction {
  std::vector<OpTime> compute;
  std::vector<CommTime> comm;
  std::int64_t microbatches = 1;
  double microbatch_sequences = 0;
  double compute_s = 0;        // the slowest stage's micro-batches, forward + backward (+ recompute)
  double optimizer_s = 0;
  double bubble_s = 0;
  double comm_s = 0;           // every collective's time
  double exposed_comm_s = 0;   // on the critical path
  double overlapped_comm_s = 0;
  double contention_s = 0;
  double step_s = 0;
  double tokens_per_s_per_gpu = 0;
  double flops_per_step = 0;   // all GPUs, attention over the full T x T (the accounting's count)
  double mfu = 0;              // flops_per_step / (step x GPUs x the cluster's bf16 peak)
};

// The step of `cfg`'s model and layout (parallel.dp, tp, pp resolved; train's checkpointing,
// parallel.microbatches or train.grad_accum) at a global batch of `batch` sequences on `gpus` GPUs.
StepPrediction predict_step(const Config& cfg, std::int64_t batch, int gpus, const Cluster& cluster,
                            const Calibration& cal);

}  // namespace lmscale::jobs::plan
