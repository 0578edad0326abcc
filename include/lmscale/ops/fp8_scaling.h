#pragma once
// The scaling state of one FP8 GEMM operand (docs/precision.md): its quantisation scale and inverse
// and its amax history, all on the operand's device (fp32), and the recipe that updates them.
// A linear layer keeps one per operand (x, w, dy): no globals.
//
//   current (torchao's tensorwise dynamic scaling): quantize() reads x twice, first for its amax
//     (history of one entry; the same kernel updates the scale), then to cast it with the scale
//     of that amax: nothing saturates (but the margin's headroom is not needed either).
//   delayed (Transformer Engine's recipe): quantize() first sets the scale from the largest amax
//     of the last `history` casts, then casts x once with it, recording x's amax into the ring
//     buffer's next slot, all in the cast's one kernel. One pass over x; values above what the
//     past saw saturate at fp8_max (the margin, in powers of two, leaves headroom for growth).
//     Until a cast has recorded a non-zero amax the scale stays 1.
//
//   current with a producer amax (docs/precision.md, "Amaxes from the producers"): the kernel that
//     wrote x also wrote its amax into amax_history() (the slot producer_amax() hands out, which
//     the producer overwrites); quantize(..., Fp8Amax::from_producer) then casts x once, the
//     cast's kernel first setting the scale from that history entry by the same rule
//     (fp8_update_scale; delayed scaling's fused update with nothing recorded). Bitwise the two
//     passes above: an amax is exact and the scale a function of the amax alone.
//
// inv_scale() stays the inverse of the scale the last quantize() used until the next quantize()
// of this operand, so a GEMM reading its output passes inv_scale() (ops::linear_fp8).
#include <cstdint>
#include <functional>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/fp8.h"
#include "lmscale/core/tensor.h"
#include "lmscale/ops/fp8.h"

namespace lmscale::ops {

enum class Fp8Recipe : std::uint8_t { current, delayed };

// Where a current-scaling quantize() finds x's amax: a pass of its own over x, or the slot its
// producer wrote (producer_amax()).
enum class Fp8Amax : std::uint8_t { measure, from_producer };

class Fp8TensorScaling {
 public:
  // history: the ring buffer's length for delayed scaling (>= 1; current scaling uses 1 whatever
  // is given). margin: the scale is divided by 2^margin. Tensors come from ctx.allocator, scale 1
  // and an empty (zero) history.
  Fp8TensorScaling(Context& ctx, Fp8Format format, Fp8Recipe recipe, int history, int margin);

  // out (dtype fp8_dtype(format()), x's element count) = fp8(x * scale) under the recipe.
  // record = false (an evaluation forward): delayed scaling casts with the scale of its history
  // as it stands and records nothing, so evaluations leave training's window untouched; current
  // scaling has no window (its state is always that of the last cast).
  void quantize(Context& ctx, const Tensor& x, Tensor& out, bool record = true);
  // The same for a 2-D x [M,K] into out [M,K] and/or its transpose out_t [K,M] (either null, not
  // both), from one read of x (ops::cast_transpose_fp8).
  // amax = from_producer (current scaling only): x's amax is in the slot producer_amax() handed
  // out since the last quantize (checked on the host); no pass measures it.
  void quantize(Context& ctx, const Tensor& x, Tensor* out, Tensor* out_t, bool record = true,
                Fp8Amax amax = Fp8Amax::measure);

  // Delayed scaling only: a cast that x's producer makes itself (lmscale/ops/fp8.h, "Casts fused
  // into their producers"). `cast` is handed this scaling's scale and the history update a delayed
  // quantize() hands ops::cast_transpose_fp8, so its codes, the scale and the recorded amax are
  // bitwise those of quantize() on the producer's output.
  using ProducerCast = std::function<void(const Tensor& scale, const Fp8HistoryUpdate& update)>;
  void quantize_in_producer(const ProducerCast& cast, bool record = true);

  // Current scaling only: the [1] fp32 slot on the device where the op producing the next x
  // writes x's amax (its amax argument, lmscale/ops/ops.h), for a quantize(..., from_producer).
  // It is the amax history's one entry, so the history holds the last amax as with a measured one.
  Tensor producer_amax();

  // Current scaling only: the state a quantize() of a tensor with this amax would leave (history
  // [amax], the scale and inverse computed from it elsewhere: fsdp's FP8 weight gathers,
  // ops::Fp8Weight), copied from 1-element fp32 tensors on the same device.
  void adopt(Context& ctx, const Tensor& amax, const Tensor& scale, const Tensor& inv_scale);

  // The history update a delayed cast records through (CUDA: the device record slot), for casts
  // made outside quantize (the optimizer step's weight casts, lmscale/ops/fp8.h).
  Fp8HistoryUpdate history_update() const {
    return {history_, -1, format_, margin_, inv_scale_, work_, device_slot_};
  }
  Fp8Format format() const { return format_; }
  Fp8Recipe recipe() const { return recipe_; }
  const Tensor& scale() const { return scale_; }            // [1] fp32
  const Tensor& inv_scale() const { return inv_scale_; }    // [1] fp32
  const Tensor& amax_history() const { return history_; }   // [H] fp32, ring buffer
  // Where the next cast records its amax. On CUDA the casts keep the slot in device memory
  // (Fp8HistoryUpdate::slot: a replayed CUDA graph records without the host), read here.
  int next_slot(Context& ctx) const;
  // The amax history on the host, oldest cast first (the ring buffer rotated so that the slot the
  // next cast fills comes first): what the results file and checkpoints hold.
  std::vector<float> history_oldest_first(Context& ctx) const;
  // The state a checkpoint saved (history_oldest_first, the scale and its inverse): the history
  // goes in oldest first with the record slot at 0, so the next cast overwrites the oldest amax
  // and every later scale is the one the saving run would have used (a scale depends on the
  // window's maximum only, never on where in the ring an amax sits).
  void restore(Context& ctx, const std::vector<float>& history_oldest_first, float scale, float inv_scale);

 private:
  Fp8Format format_;
  Fp8Recipe recipe_;
  int margin_;
  int slot_ = 0;   // the CPU's record slot; on CUDA the kernels use device_slot_ (next_slot reads it)
  bool producer_armed_ = false;   // producer_amax() was handed out and no quantize has read it yet
  Tensor scale_, inv_scale_, history_;
  Tensor work_;   // [2] int32 zeros: the fused kernels' amax accumulator and block counter
  Tensor device_slot_;   // CUDA: [1] int32, the record slot the kernels use and advance (slot_ on the CPU)
};

}  // namespace lmscale::ops
