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

#include "lmscale/comm/work.h"
#include "lmscale/jobs/resilience/fault_injection.h"
#include "lmscale/jobs/job_env.h"
#include "lmscale/parallel/grad_buckets.h"
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
class GradientSync;
class ShardedOptimizer;
class ZeroOptimizer;
class FullyShardedDataParallel;
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

  // One optimizer step on `tokens`: this rank's rows, host int32 [b, T+1].
  StepResult train_step(const std::vector<std::int32_t>& tokens, std::int64_t T);
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
  model::TransformerLM& model() {
    settle_optimizer();
    return *model_;
  }
  // Null with a sharded optimizer (parallel.zero): then sharded() holds the state.
  optim::Optimizer* optimizer() {
    settle_optimizer();
    return optimizer_.get();
  }
  // parallel.overlap_optimizer: makes the compute stream wait for the whole pending update and
  // frees the gradients it read (no host wait). Anything that reads parameters or optimizer
  // state outside train_step's forward calls it first; a no-op when nothing is pending.
  void settle_optimizer() { wait_for_update(kAllUnits); }
  parallel::ShardedOptimizer* sharded() { return sharded_.get(); }
  // parallel.overlap_param_gather in effect: the segments of the parameter all-gather that each
  // step leaves in flight for the next forward (0: gathered inside the step).
  std::size_t param_gather_segments() const { return gather_segments_.size(); }
  // parallel.zero = fsdp on several ranks (the store then holds no flat parameters), else null.
  parallel::FullyShardedDataParallel* fsdp() { return fsdp_; }
  // The full fp32 parameters in the full model's flat layout (model::parameter_layout(dims)) on
  // the host (collective under fsdp and tensor parallelism).
  std::vector<float> full_parameters();
  // Sets them from that layout on every rank (after loading a weights file).
  void set_parameters(const std::vector<float>& flat);
  // A buffer in this rank's store layout (e.g. optimizer moments) -> the full layout (collective
  // under tensor and pipeline parallelism: gathered over tp, then over pp), and back.
  std::vector<float> to_full_layout(const std::vector<float>& local);
  std::vector<float> to_local_layout(const std::vector<float>& full) const;
  // Null without tensor parallelism.
  parallel::TensorParallel* tensor_parallel() { return tp_.get(); }
  parallel::GradientSync& sync() { return *sync_; }
  // parallel.pp > 1: this rank's pipeline stage (its schedule, events and bubble), else null.
  parallel::PipelineParallel* pipeline() { return pipeline_.get(); }
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
  // Uploads rows [r0, r1) of `tokens` as inputs and targets (int32 [rows, T]) on the device.
  std::pair<Tensor, Tensor> upload(const std::vector<std::int32_t>& tokens, std::int64_t T, std::int64_t r0,
                                   std::int64_t r1);
  double reduce_loss(Tensor& loss_sum_device, double tokens_global);
  // Sum of a host scalar over the pipeline stages (identity without pp): stages hold disjoint
  // parameters (squared gradient norms add) and only the last one holds the loss.
  double sum_over_stages(double x);
  // A strategy's hooks plus the tensor-parallel collectives.
  model::ParallelContext with_tp(model::ParallelContext pc) const;
  // Sum of squares of the global gradient after the sync (tensor parallel: norms counted once).
  double global_grad_sum_squares(Context& ctx);
  void accumulate_micro_batches(const std::vector<std::int32_t>& tokens, std::int64_t T, StepResult& r,
                                std::vector<Tensor>& loss_sums);

  JobEnv& env_;
  model::ModelDims dims_;
  // The dp x tp x pp mesh of the device and host communicators (null without tp and pp), and
  // the tensor-parallel strategy.
  std::unique_ptr<comm::Mesh> mesh_, host_mesh_;
  std::unique_ptr<parallel::TensorParallel> tp_;
  std::unique_ptr<model::ParameterStore> params_;
  // The model (with the interleaved schedule: one per chunk of this rank, model_ the first).
  std::vector<std::unique_ptr<model::TransformerLM>> chunk_models_;
  model::TransformerLM* model_ = nullptr;
  std::unique_ptr<optim::Optimizer> optimizer_;   // optim.name over the whole store (unsharded layouts)
  std::unique_ptr<parallel::ShardedOptimizer> sharded_;
  parallel::FullyShardedDataParallel* fsdp_ = nullptr;   // sharded_ when it is fsdp
  // One process: gradients per bucket, allocated during the backward, freed after the step.
  std::unique_ptr<parallel::LazyGradients> lazy_;
  void release_gradients();
  // Waits for the data-parallel gradient reduction (the sync's finish(); NVTX gradient_sync) and
  // records the wait as r.times.comm_ms. Both step kinds end their backward with it.
  void finish_gradient_sync(StepResult& r);
  // parallel.overlap_optimizer (one process or DDP on CUDA, no tp/pp): segment b's update runs
  // on the runtime's side stream after the step's backward and gradient norm; the next forward's
  // before_forward(u) makes the compute stream wait for the buckets holding parameters of units
  // <= u and frees their gradients. Results are unchanged (same kernels on the same inputs).
  // parallel.overlap_param_gather (zero1/zero2, no tp/pp): the same waits, on the segments'
  // all-gathers that ZeroOptimizer::step left in flight (`gathered`).
  struct PendingUpdate {
    int bucket = -1;              // a lazy gradient bucket to free after the wait, or -1
    int first_unit = 0;           // the lowest unit with a parameter in the bucket
    ops::Runtime::Mark done;      // on the side stream, after the bucket's update
    comm::Work gathered;          // or: the segment's parameter all-gather
  };
  parallel::ZeroOptimizer* zero_ = nullptr;   // sharded_ when it is zero1/zero2 with deferred gathers
  static constexpr int kAllUnits = 1 << 30;
  bool overlap_optimizer_ = false;
  // parallel.comm_sms: the phases whose GEMMs run beside NCCL collectives and so are planned for
  // the SMs NCCL leaves (ops::Runtime::GemmCarveout): the backward with data or pipeline
  // parallelism (gradient reductions, activation transfers), the forward with fsdp (all-gathers)
  // or pipeline parallelism. Tensor parallelism's collectives are waited on in order, not
  // overlapped, so tp alone gets no carve-out.
  bool carve_forward_ = false, carve_backward_ = false;
  struct UpdateSegment {
    parallel::GradBucket range;   // the lazy bucket (one process) or a range of the flat buffer (DDP)
    int first_unit = 0;
  };
  std::vector<UpdateSegment> update_segments_;
  std::vector<UpdateSegment> gather_segments_;   // overlap_param_gather: in forward order
  std::vector<PendingUpdate> pending_updates_;  // ascending first_unit (forward order)
  std::size_t next_pending_ = 0;
  void wait_for_update(int unit);
  // A strategy's forward hooks with the overlapped update's waits in front of before_forward.
  model::ParallelContext with_update_waits(model::ParallelContext pc);
  std::unique_ptr<parallel::GradientSync> owned_sync_;
  // Pipeline parallelism: this rank's stage (its mesh is mesh_ / host_mesh_).
  std::unique_ptr<parallel::PipelineParallel> pipeline_;
  int dp_size_ = 1, dp_rank_ = 0;
  ops::Runtime::Mark pipe_begin_, pipe_end_;
  // Fills r's forward/backward times from the pipeline's events (after the step: waits for it).
  void pipeline_times(StepResult& r);
  parallel::GradientSync* sync_ = nullptr;
  std::map<std::string, std::map<std::string, std::size_t>> memory_points_;
  optim::LossScaler scaler_;
  optim::CosineSchedule schedule_;
  std::int64_t global_batch_, grad_accum_, local_rows_, first_row_;
  std::int64_t step_ = 0;
  double lr_scale_ = 1.0;
  DType master_, lowp_;
  // Test-only (LMSCALE_FAULT_SLEEP_*): read once here, applied at the start of train_step.
  const FaultInjection faults_ = FaultInjection::from_environment();
  // The unsharded optimizer's step (one process, DDP, tp, pp): over the flat gradient buffer or
  // the lazy buckets, with the tp reduction of the layer-wise norms.
  void step_unsharded(Context& ctx, double lr, double grad_scale);
};

}  // namespace lmscale::jobs
