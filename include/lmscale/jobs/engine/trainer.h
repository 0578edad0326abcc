#pragma once
// One training step of the Transformer LM, shared by the `train` and `bench-model` jobs: zero the
// gradients, forward + backward over the micro-batches of this rank's slice of the global batch,
// synchronise gradients (data-parallel strategies), clip, and the optimizer step, with the time
// of each phase measured on the device's timeline and memory peaks per phase.
#include <cstdint>
#include <map>
#include <string>
#include <memory>
#include <optional>
#include <vector>

#include "lmscale/jobs/engine/graphed_step.h"
#include "lmscale/jobs/resilience/fault_injection.h"
#include "lmscale/jobs/job_env.h"
#include "lmscale/parallel/schedule.h"
#include "lmscale/parallel/strategy.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/transformer.h"
#include "lmscale/optim/optimizer.h"
#include "lmscale/optim/loss_scaler.h"
#include "lmscale/optim/lr_schedule.h"

namespace lmscale::comm {
class Mesh;
}

namespace lmscale::parallel {
class PipelineParallel;
class TensorParallel;
class ExpertParallel;
class GradientSync;
class ShardedOptimizer;
class FullyShardedDataParallel;
class FullLayout;
}

namespace lmscale::jobs {

struct StepTimes {
  double forward_ms = 0, backward_ms = 0, comm_ms = 0, optimizer_ms = 0, total_ms = 0;
};

struct StepResult {
  double loss = 0;        // global mean loss over the global batch (nats/token)
  double grad_norm = 0;   // global gradient norm before clipping (0 when not computed)
  double lr = 0;
  bool skipped = false;   // fp16 overflow: no optimizer step
  double loss_scale = 1;
  StepTimes times;
};

class Trainer {
 public:
  // global_batch: sequences per optimizer step over all data-parallel ranks; the rank takes
  // rows [dp_rank*B/dp, (dp_rank+1)*B/dp) and splits them into grad_accum micro-batches.
  // parallel.tp > 1: the world is a dp x tp mesh (comm/mesh.h); the ranks of a tp group take the
  // same rows and each holds its slices of the parameters (parallel/tensor_parallel.h).
  // parallel.pp > 1: the world is a dp x pp mesh; each rank holds its stage's units (model/stage.h)
  // and the step runs the pipeline schedule over parallel.microbatches (parallel/pipeline.h).
  // Both (tp x pp, dp x tp x pp): each rank holds its tp slices of its stage's units.
  Trainer(JobEnv& env, std::int64_t global_batch, std::int64_t grad_accum, std::int64_t total_steps);
  ~Trainer();

  // One optimizer step on `tokens`: this rank's rows, host int32 [b, T+1]. Under
  // train.cuda_graphs a replay of the step captured for this T (jobs/engine/graphed_step.h), with
  // the same results; its phases are then not timed (times.total_ms only).
  StepResult train_step(const std::vector<std::int32_t>& tokens, std::int64_t T);
  // train.cuda_graphs: whether it is on, and its counts so far.
  bool cuda_graphs() const { return cuda_graphs_; }
  GraphStats graph_stats() const;
  // optim.reference_batch > 0: global batch / reference_batch, the factor of the linear LR
  // scaling rule applied to the schedule's lr and min_lr; 1 otherwise.
  double lr_scale() const { return lr_scale_; }
  // Forward only (no gradients) over this rank's rows; returns the global mean loss.
  double forward_loss(const std::vector<std::int32_t>& tokens, std::int64_t T, StepTimes* times = nullptr);
  // Forward + backward without the optimizer step (bench-model forward-backward mode).
  StepResult forward_backward(const std::vector<std::int32_t>& tokens, std::int64_t T);

  // These accessors first finish an overlapped optimizer step (settle_optimizer()).
  model::ParameterStore& params() {
    settle_optimizer();
    return *params_;
  }
  model::TransformerLM& model();   // the first chunk's
  // The same model, for what the steps record in it (MoE routing counts, FP8 amax histories),
  // without settle_optimizer(): the forward and backward write those on the compute stream, the
  // update does not touch them, and waiting for an update left in flight here would put it
  // between two steps (parallel.overlap_optimizer), outside both steps' timing.
  model::TransformerLM& recording_model() { return *chunk_models_.front(); }
  // The optimizer over the whole store, or null with a sharded optimizer (parallel.zero): then
  // sharded() holds the state.
  optim::Optimizer* optimizer();
  // parallel.overlap_optimizer / overlap_param_gather: makes the compute stream wait for the
  // whole pending update (no host wait). Anything that reads parameters or optimizer state
  // outside train_step's forward calls it first; a no-op when nothing is pending.
  void settle_optimizer();
  parallel::ShardedOptimizer* sharded();
  // parallel.overlap_param_gather in effect: the segments of the parameter all-gather that each
  // step leaves in flight for the next forward (0: gathered inside the step).
  std::size_t param_gather_segments() const;
  // parallel.zero = fsdp on several ranks (the store then holds no flat parameters), else null.
  parallel::FullyShardedDataParallel* fsdp();
  // The data-parallel strategy (parallel/strategy.h): checkpoint layouts and optimizer state.
  parallel::Strategy& strategy() { return *strategy_; }
  // The full fp32 parameters in the full model's flat layout (model::parameter_layout(dims)) on
  // the host (collective under fsdp, ZeRO, tensor and pipeline parallelism).
  std::vector<float> full_parameters();
  // Sets them from that layout on every rank (after loading a weights file).
  void set_parameters(const std::vector<float>& flat);
  // The parameters were written from outside the step (set_parameters, a checkpoint's restore): the
  // FP8 weights the step casts (model/fp8_weight_casts.h) are cast again at the next forward.
  void weights_replaced();
  // A buffer in this rank's store layout (e.g. optimizer moments) -> the full layout (collective
  // under tensor and pipeline parallelism: gathered over tp, then over pp), and back
  // (parallel/full_layout.h).
  std::vector<float> to_full_layout(const std::vector<float>& local);
  std::vector<float> to_local_layout(const std::vector<float>& full) const;
  // Null without tensor parallelism.
  parallel::TensorParallel* tensor_parallel() { return tp_.get(); }
  parallel::GradientSync& sync();
  // parallel.pp > 1: this rank's pipeline stage (its schedule, events and bubble), else null.
  parallel::PipelineParallel* pipeline();
  // Data-parallel degree and index of this rank (world / (tp*pp) ranks hold each stage).
  int dp_size() const { return dp_size_; }
  int dp_rank() const { return dp_rank_; }
  // Bytes per allocation tag at points of the last step: "after_init", "before_optimizer",
  // "after_optimizer" (docs/architecture.md §5 memory accounting).
  const std::map<std::string, std::map<std::string, std::size_t>>& memory_points() const { return memory_points_; }
  optim::LossScaler& loss_scaler() { return scaler_; }
  std::int64_t step() const { return step_; }
  void set_step(std::int64_t s) { step_ = s; }
  std::int64_t local_rows() const { return local_rows_; }
  std::int64_t first_row() const { return first_row_; }
  const model::ModelDims& dims() const { return dims_; }

 private:
  // Rows [r0, r1) of `tokens` split into inputs and targets, host int32 [rows, T] each.
  parallel::MicroBatch split_rows(const std::vector<std::int32_t>& tokens, std::int64_t T, std::int64_t r0,
                                  std::int64_t r1);
  // Uploads rows [r0, r1) of `tokens` as inputs and targets (int32 [rows, T]) on the device.
  parallel::MicroBatch upload(const std::vector<std::int32_t>& tokens, std::int64_t T, std::int64_t r0,
                              std::int64_t r1);
  // The step's micro-batches from `tokens` (uploaded), one of grad_accum each.
  parallel::MicroBatchSource uploads(const std::vector<std::int32_t>& tokens, std::int64_t T);
  // The step's micro-batches through the schedule, then the wait for the gradient
  // synchronisation (NVTX gradient_sync, r.times.comm_ms).
  void run_micro_batches(const parallel::MicroBatchSource& batches, std::int64_t T, StepResult& r,
                         std::vector<Tensor>& loss_sums);
  // The eager step (train.cuda_graphs off, and each shape's first step with it on).
  StepResult eager_step(const std::vector<std::int32_t>& tokens, std::int64_t T);
  // train.cuda_graphs (jobs/engine/graphed_step.cpp): the step as a replay of the graph captured
  // for (T, loss scale), capturing it first where none is; a key's first step runs eagerly.
  StepResult graphed_step(const std::vector<std::int32_t>& tokens, std::int64_t T);
  void capture_step(std::int64_t T);
  // Device scalars (one per micro-batch) -> host values summed over the dp replicas and the
  // stages: one device-to-host copy and one host all-reduce per axis, whatever their number.
  std::vector<double> read_over_replicas(const std::vector<Tensor>& sums);
  double mean_loss(const std::vector<Tensor>& loss_sums, double tokens_global);
  // The schedule's times that only the finished step knows (pipeline events).
  void finish_pass_times(StepResult& r);

  JobEnv& env_;
  model::ModelDims dims_;
  // The dp x tp x pp mesh of the device and host communicators (null for one process without
  // communicators), and the tensor-parallel collectives (null without tp).
  std::unique_ptr<comm::Mesh> mesh_, host_mesh_;
  std::unique_ptr<parallel::TensorParallel> tp_;
  std::unique_ptr<parallel::ExpertParallel> ep_;   // parallel.ep > 1
  std::unique_ptr<model::ParameterStore> params_;
  // The model (with the interleaved schedule: one per chunk of this rank).
  std::vector<std::unique_ptr<model::TransformerLM>> chunk_models_;
  std::unique_ptr<parallel::Schedule> run_;          // how micro-batches run (pipeline or not)
  std::unique_ptr<parallel::Strategy> strategy_;     // what parallel.zero / ddp do
  model::Fp8WeightCasts* fp8_casts_ = nullptr;       // the step's FP8 weight casts (the model's), or null
  std::unique_ptr<parallel::FullLayout> layout_;     // store layout <-> the full model's
  int dp_size_ = 1, dp_rank_ = 0;
  std::map<std::string, std::map<std::string, std::size_t>> memory_points_;
  optim::LossScaler scaler_;
  optim::CosineSchedule schedule_;
  std::int64_t global_batch_, local_rows_ = 0, first_row_ = 0;
  std::int64_t step_ = 0;
  double lr_scale_ = 1.0;
  // train.cuda_graphs: the captured step of the current key, AdamW's per-step scalars it reads
  // (f32 [ops::kAdamWScalars], allocated before any capture), the key of the last eager step.
  bool cuda_graphs_ = false;
  std::unique_ptr<GraphedStep> graphed_;
  Tensor adamw_scalars_;
  std::int64_t eager_T_ = -1;
  double eager_scale_ = 0;
  GraphStats graph_stats_;
  // Test-only (LMSCALE_FAULT_SLEEP_*): read once here, applied at the start of train_step.
  const FaultInjection faults_ = FaultInjection::from_environment();
};

}  // namespace lmscale::jobs
