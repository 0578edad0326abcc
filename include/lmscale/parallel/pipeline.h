#pragma once
// Pipeline parallelism (docs/architecture.md §4): the model's units split into pp stages (model/stage.h),
// one per rank of the pp group; each optimizer step runs M microbatches through the stages under
// a schedule, activations [b*T, d] travelling forward and their gradients backward by
// point-to-point transfers on the pp communicator (NCCL on GPUs, MPI on CPUs).
//
// Schedules (per stage s of p, M microbatches, F = forward, B = backward of one microbatch):
//   gpipe  all M forwards, then all M backwards (GPipe, Huang et al. 2019). Backwards run in
//          microbatch order 0..M-1, as in 1F1B, so both accumulate gradients in the same order
//          and give bitwise the same result. Holds M microbatches' activations.
//   1f1b   PipeDream-flush / Megatron: min(p-s-1, M) warm-up forwards, then alternate one
//          forward and one backward, then the remaining backwards. Holds at most p-s
//          microbatches' activations; the same bubble as gpipe.
//   interleaved  Megatron's interleaved 1F1B (Narayanan et al. 2021): each rank holds V model
//          chunks (virtual stages c*p + s, c = 0..V-1) and runs the 1F1B pattern over the
//          M*V chunk-microbatches; activations go around the ring (rank p-1's chunk c feeds rank
//          0's chunk c+1). Needs M a multiple of p. Each chunk-step is 1/V of a stage-step, so the
//          fill and drain shrink V times: bubble (p-1)/(M+p-1)/V as the issue states it. Each
//          communication point is one grouped Communicator::exchange (parallel/
//          interleaved_schedule.h), so it runs on NCCL too (matched by order, not tag).
//   zb-h1  Zero Bubble's ZB-H1 (Qi et al. 2023): 1f1b's forwards and backwards, each backward
//          split into B (input gradients, on the critical path: sent on at once) and W (the
//          blocks' matmul weight gradients, TransformerLM::backward_weights). Stage s runs the W
//          of microbatch i after the steady phase's backward of microbatch i + s, and in the
//          cool-down one W after each B (filling the wait for the next gradient), the rest at the
//          end. At most p microbatches are between their forward and their W on any stage, the
//          first stage's 1F1B bound (its peak unchanged); the cool-down's chain of backwards
//          passes costs B instead of B + W per stage. W runs in microbatch order, with the same
//          products as 1f1b: gradients bitwise those of 1f1b.
// Both gpipe and 1f1b have the bubble fraction (p-1)/(M+p-1) of each stage's step time (forward
// and backward times tf, tb per microbatch: the step spans (M+p-1)(tf+tb), a stage is busy
// M(tf+tb)).
//
// Communication follows Megatron's pairing so that no two neighbours both wait to send: in the
// steady 1F1B phase a forward's "send activation, receive gradient" is one grouped sendrecv and
// matches the neighbour's "send gradient, receive activation". Sends are asynchronous (the
// compute goes on); a send's buffer is kept until the work is waited on. On NCCL a wait orders
// the compute stream after the transfer and never blocks the host, so the host queues a whole
// step without a synchronisation per microbatch.
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/io/config.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/runtime.h"
#include "lmscale/parallel/gradient_sync.h"

namespace lmscale::parallel {

// The deck's parallel.schedule (gpipe | 1f1b | interleaved | zb-h1).
using PipeSchedule = PipelineSchedule;

// Theory: idle fraction of a stage's step, (p-1)/(M+p-1) (divided by v for v virtual stages).
// zb-h1 (docs/parallel.md derives it): the idle time (p-1)(f+b) - (min(M,p)-1) w of each stage over a
// step of M microbatches whose forward, B and W passes take f, b, w, as a fraction of the step
// (idle + M(f+b+w)); with w = 0 it is 1f1b's (p-1)/(M+p-1).
double zero_bubble_fraction(int stages, int microbatches, double f, double b, double w);
double theory_bubble_fraction(int stages, int microbatches, int virtual_stages = 1);
// The theory a schedule is reported with (the pipeline report, the accounting's ideal step):
// theory_bubble_fraction for gpipe, 1f1b and interleaved; zero_bubble_fraction with equal forward,
// B and W passes for zb-h1 (Qi et al. 2023's assumption). formula: its name as printed.
struct TheoryBubble {
  double fraction = 0;
  const char* formula = "";
};
TheoryBubble schedule_theory_bubble(PipelineSchedule schedule, int stages, int microbatches, int virtual_stages);

// One forward or backward of one microbatch on this stage, in ms from the start of the step's
// pipeline (the stage's own clock; device timeline on GPUs).
struct PipeEvent {
  int micro = 0;
  bool backward = false;   // B (and W) passes
  bool weight = false;     // zb-h1's W pass (backward is true too)
  int chunk = 0;   // interleaved: which of the rank's model chunks
  double start_ms = 0, end_ms = 0;
};

// What one stage measured over one step's pipeline.
struct PipeStageStats {
  double busy_forward_ms = 0, busy_backward_ms = 0;
  double span_ms = 0;   // from the start of the pipeline to the end of this stage's last backward
  double idle_ms() const { return span_ms - busy_forward_ms - busy_backward_ms; }
  double bubble_fraction() const { return span_ms > 0 ? idle_ms() / span_ms : 0; }
};

class PipelineParallel {
 public:
  // chunks: this stage's model(s) (one; interleaved: one per chunk, in chunk order, sharing one
  // store); pp: the pipeline group, rank = stage index. tp: with tensor-parallel stages (the
  // store's TensorSplit active; tp x pp), the tp group's collectives that every model call gets
  // in its ParallelContext (parallel/tensor_parallel.h); the pp group is then the ranks of one tp
  // index, so each tp rank runs its own copy of the schedule and sends to its counterpart.
  PipelineParallel(std::vector<model::TransformerLM*> chunks, comm::Communicator& pp, ops::Runtime& rt,
                   PipeSchedule schedule, model::TensorParallelComm tp = {});

  int stage() const { return stage_; }
  int stages() const { return stages_; }
  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ + 1 == stages_; }

  // One pipeline flush over microbatches m = 0..M-1 (M = tokens.size()): tokens[m] / targets[m]
  // int32 [b, T] on the device (the first stage reads tokens, the last targets; others neither).
  // grad_scale as in TransformerLM::forward. The first backward overwrites the gradients unless
  // `accumulate`. sync.hooks(micro_offset + m, micro_count) are the backward hooks of
  // microbatch m (data parallelism reduces on the last one). The last stage appends each
  // microbatch's loss sum (device scalar) to loss_sums. Events and stats replace the previous
  // step's.
  void run(const std::vector<Tensor>& tokens, const std::vector<Tensor>& targets, std::int64_t T, double grad_scale,
           bool accumulate, GradientSync& sync, int micro_offset, int micro_count, std::vector<Tensor>& loss_sums);

  // Forward only (evaluation) of tokens/targets [b, T]: the loss sum on the last stage (device
  // scalar), an undefined tensor on the others. hooks: the strategy's evaluation forward hooks
  // (GradientSync::forward_hooks(false): fsdp's gathers).
  Tensor forward_only(const Tensor& tokens, const Tensor& targets, std::int64_t T,
                      const model::ParallelContext& hooks = {});

  // Computes the step's events and stats from the recorded marks (waits for the device).
  void finish_timing();
  const std::vector<PipeEvent>& events() const { return events_; }
  const PipeStageStats& stats() const { return stats_; }

 private:
  struct Slot;   // one microbatch in flight on this stage (of one chunk)
  void run_interleaved(const std::vector<Tensor>& tokens, const std::vector<Tensor>& targets, std::int64_t T,
                       double grad_scale, bool accumulate, GradientSync& sync, int micro_count,
                       std::vector<Tensor>& loss_sums);
  Tensor recv_activation(std::int64_t rows);
  // The chunk owning the head runs its head unit's backward inside the forward (fused LM head +
  // cross-entropy, TransformerLM::forward_stage): it takes microbatch m's backward hooks from
  // sync here, once, and keeps them in the slot for the backward.
  void forward(int m, Slot& slot, const Tensor& input, const Tensor& targets, std::int64_t T, double grad_scale,
               std::vector<Tensor>& loss_sums, bool accumulate, GradientSync& sync, int micro_offset,
               int micro_count, int chunk = 0);
  Tensor backward(int m, Slot& slot, Tensor dy, bool accumulate, GradientSync& sync, int micro_offset,
                  int micro_count, int chunk = 0);
  // zb-h1: the W pass of the oldest microbatch whose B ran (nothing when none waits).
  void weight_pass(GradientSync& sync, int micro_offset, int micro_count);
  void keep_send(comm::Work w, Tensor buf);
  // Microbatch `micro`'s backward hooks (with the tp callbacks), asked of sync once per step.
  const model::ParallelContext& hooks_for(GradientSync& sync, int micro, int micro_count);
  // A strategy's hooks plus the tp callbacks (identity without tensor parallelism).
  model::ParallelContext with_tp(model::ParallelContext pc) const;
  // Rows of one transfer for a microbatch of N = b*T tokens: N, or N/tp under sequence parallelism.
  std::int64_t transfer_rows(std::int64_t N) const;

  std::vector<model::TransformerLM*> chunks_;
  comm::Communicator& pp_;
  ops::Runtime& rt_;
  PipeSchedule schedule_;
  int stage_ = 0, stages_ = 1;
  std::int64_t d_ = 0;
  DType act_dtype_;
  model::TensorSplit split_;         // the stores' (every chunk shares one store)
  model::TensorParallelComm tp_;
  // This step's backward hooks by microbatch (hooks_for; cleared when a step starts).
  std::map<int, model::ParallelContext> hooks_;
  // Sends in flight with the buffers they read (kept alive until waited on).
  std::vector<std::pair<comm::Work, Tensor>> sends_;
  // zb-h1: the weight-gradient products of the microbatches whose B ran, oldest first.
  struct PendingWeights {
    int micro;
    std::vector<model::WeightGradWork> work;
  };
  std::deque<PendingWeights> weights_;
  // Timing: marks per event, turned into events_ by finish_timing().
  struct RawEvent {
    int micro;
    bool backward;
    int chunk;
    ops::Runtime::Mark begin, end;
    bool weight = false;   // zb-h1's W pass
  };
  ops::Runtime::Mark start_;
  std::vector<RawEvent> raw_;
  std::vector<PipeEvent> events_;
  PipeStageStats stats_;
};

}  // namespace lmscale::parallel
