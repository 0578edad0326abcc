#pragma once
// The FP8 GEMM weights cast by the optimizer step (precision.fp8_weight_casts = optimizer, delayed
// scaling on CUDA; docs/precision.md, "Weights cast by the optimizer step"). One ops::Fp8WeightCast
// per FP8 layer of a model's blocks (q|k|v, o, w1|w3, w2: the group's weights back to back in the
// store, model/fp8_layers.h), holding the layer's codes q [R, K] and their transpose qt [K, R] from
// one step to the next, under the layer's own w scaling (ops::Fp8Linear::w_scaling). The layers
// then read q and qt as they are: no forward casts or transposes a weight.
//
// Bitwise the forward's casts of delayed scaling: each step's AdamW pass casts the new weights
// with the scale of the history as the next forward would find it, and the amax it measures
// enters the history just before the following cast's scale is derived (ops::
// fp8_weight_casts_begin), so the histories between steps are the ones the forward casts leave.
// What differs: the scale held between steps is the next one (the forward's cast would set it at
// the start of the next forward), and an evaluation records no weight amax, as it never did.
//
// State on the host: whether q and qt hold the current weights' codes (ready) and whether an amax
// awaits its record (pending). The codes are made anew by cast_now: by the model at the first
// training forward that finds them stale (at the start, and after weights were replaced: a
// resumed run's restored history is the one the saving run had, its pending amax unrecorded), by
// the Trainer before a captured step runs on stale codes, and after an eager step skipped on a
// non-finite norm (which did not cast; a captured step's kernel casts itself). Until the first
// cast_now an evaluation forward casts from the working copy, which is current then (the step
// stops writing it for these weights only once it casts them).
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/fp8_linear.h"

namespace lmscale::model {

class Fp8WeightCasts {
 public:
  // casts: sorted by offset in `params` (the store's fp32 flat buffer); rounding: the compute dtype.
  Fp8WeightCasts(std::vector<ops::Fp8WeightCast> casts, Tensor params, DType rounding);

  // What the optimizer step takes (ops::AdamWStep::fp8_casts); before_step first, after_step after.
  const std::vector<ops::Fp8WeightCast>& casts() const { return casts_; }
  void before_step(Context& ctx) const { ops::fp8_weight_casts_begin(ctx, casts_, pending_); }
  void after_step() { ready_ = pending_ = true; }

  bool ready() const { return ready_; }
  // The codes of the current weights and their amaxes pending, without an update (the first
  // training forward that finds them stale).
  void cast_now(Context& ctx);
  // New weights from outside the step (a checkpoint, a weights file): the codes are stale and the
  // pending amax (of the old weights) is dropped.
  void weights_replaced() { ready_ = pending_ = false; }

  // Cast i as an FP8 layer's weight (q, qt, and the scaling's scale and inverse).
  ops::Fp8Weight weight(std::size_t i) const;
  // Bytes on the device: the codes, their transposes and the pending amaxes.
  std::size_t bytes() const;

 private:
  std::vector<ops::Fp8WeightCast> casts_;
  Tensor params_;
  DType rounding_;
  bool ready_ = false, pending_ = false;
};

}  // namespace lmscale::model
