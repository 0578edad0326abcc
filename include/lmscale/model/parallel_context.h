#pragma once
// How parallel strategies reach into the model without the model knowing about communication
// (docs/architecture.md §1). With every degree 1 it is a no-op: the default-constructed context.
//
// The model is a sequence of *units*, in forward order:
//   unit 0         the token embedding
//   unit 1 .. L    blocks 0 .. L-1
//   unit L + 1     the final RMSNorm and the LM head (with the loss)
// A strategy sees each unit's use of its weights through four hooks, called in this order:
//   forward:   before_forward(u), the unit's forward, after_forward(u)        for u = 0 .. L+1
//   backward:  before_backward(u), [recompute], the unit's backward, after_backward(u)
//                                                                             for u = L+1 .. 0
// The head unit's backward is fused into a training forward (the LM head and cross-entropy run
// in row chunks whose logits become their gradient at once; transformer_head.cpp), so for unit
// L+1 of a training forward the order is
//   before_forward(L+1), before_backward(L+1), on_grad_ready(lm_head), on_grad_ready(ln_final),
//   after_backward(L+1), after_forward(L+1)
// and backward() starts at unit L. A strategy therefore hands the model one context holding the
// micro-batch's forward and backward hooks for both calls (jobs/engine/trainer.cpp; the pipeline keeps
// the head stage's backward hooks in its slot), and a strategy's backward state (FSDP's
// micro-batch index, the gradient bucket counters) must be set before that forward.
// With activation checkpointing every k blocks the backward calls before_backward for all the
// units of a group (highest first) before it recomputes the group's forward, then runs the
// group's backwards, each followed by its after_backward. The recompute itself calls no forward
// hooks: the weights it reads are the ones before_backward made available.
//
// The design covers the three model-parallel modes (docs/internals.md, "ParallelContext"):
//   - FSDP (parallel/fsdp.cpp): before_* gathers a unit's weights (and prefetches the next),
//     after_forward frees them, after_backward reduce-scatters the unit's gradients. The weights
//     and gradients themselves are reached through the ParameterStore's providers.
//   - tensor parallelism (parallel/tensor_parallel.cpp, model/tensor_parallel.h): a static part
//     (model::TensorSplit: degree, rank, sequence parallelism; given to the ParameterStore, from
//     which the model derives its local shapes) and the collectives of Megatron's f/g points of
//     each sublayer as callbacks here (`tp`).
//   - pipeline parallelism: a static part (the stage's unit range; whether it owns the embedding
//     and the head); the schedule in parallel/ drives the model one microbatch and one stage at a
//     time through the same per-unit forward and backward.
// Only the parts that are built exist as members; the others are added by their modes.
#include <functional>

#include "lmscale/model/expert_parallel.h"
#include "lmscale/model/tensor_parallel.h"

namespace lmscale::model {

struct ParallelContext {
  // Called during the backward as soon as parameter i's gradient is final for this backward
  // pass (in reverse layer order), so data-parallel strategies can start reducing it while the
  // backward goes on.
  std::function<void(int param_index)> on_grad_ready;

  // Per-unit hooks (units as above); any may be empty.
  std::function<void(int unit)> before_forward, after_forward, before_backward, after_backward;

  // Tensor parallelism: the collectives over the tp group from which the model builds Megatron's
  // f and g (model/tensor_parallel.h). Empty without tensor parallelism. The static part (degree,
  // rank, sequence parallelism) is the parameter store's TensorSplit.
  TensorParallelComm tp;

  // Expert parallelism: the all-to-alls of the MoE blocks' dispatch and combine over the ep group
  // (model/expert_parallel.h). Empty without expert parallelism.
  ExpertParallelComm ep;
};

}  // namespace lmscale::model
