#pragma once
// The per-step scalars of a train step captured as a CUDA graph (train.cuda_graphs,
// docs/architecture.md §5, "The captured step"), kept in device memory: a replay repeats the
// captured kernels with their captured arguments, so whatever changes from step to step (the
// learning rate, the step count in AdamW's bias corrections, the clipping factor) must be read by
// the kernels from memory that holds this step's values.
//
// - The host knows lr and t before the step: adamw_upload_scalars writes AdamW's scalars for them
//   with one host-to-device copy, queued before the replay (outside the graph).
// - Only the device knows the gradient norm: clip_grad_scale, inside the graph, turns the sums of
//   squares into the norm, the clipped gradient scale and the finite flag, which the AdamW kernel
//   reads (ops::AdamWStep::device_clip). The host reads the norm after the replay, with the loss.
#include <cstdint>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops {

// Slots of clip_grad_scale's output (f64).
constexpr std::int64_t kClipSlots = 3;
enum ClipSlot : std::int64_t { kClipNorm = 0, kClipGradScale = 1, kClipFinite = 2 };

// The clipping factor of a global gradient norm against max_norm (<= 0: no clipping). The one
// host definition: optim::clip_factor (the eager step) and clip_grad_scale's CPU reference call
// it; the CUDA kernel writes the same two correctly rounded operations (__dadd_rn, __ddiv_rn).
inline double clip_factor(double norm, double max_norm) {
  return (max_norm <= 0.0 || norm <= max_norm) ? 1.0 : max_norm / (norm + 1e-6);
}

// Global-norm clipping without a host read. partials: [n] sums of squares of the loss-scaled
// gradients (f32 on CUDA, as ops::sum_squares writes them; f32 or f64 on the CPU); out: f64
// [kClipSlots] on the same device:
//   out[kClipNorm]      = norm = sqrt(sum over i in index order of double(partials[i])) * inv_scale
//   out[kClipGradScale] = inv_scale * (max_norm <= 0 || norm <= max_norm ? 1 : max_norm / (norm + 1e-6))
//   out[kClipFinite]    = 1 where norm is finite, else 0
// Bitwise what the host computes from the same partials (optim::sum_of_squares, then
// optim::clip_factor): each step is one correctly rounded IEEE double operation on either side.
void clip_grad_scale(Context& ctx, const Tensor& partials, double inv_scale, double max_norm, Tensor& out);

// AdamW's per-step scalars for `a` (lr, step, betas, eps, weight decay; a.grad_scale is ignored:
// the kernel takes clip_grad_scale's) into `scalars`, f32 [kAdamWScalars] on the device, bitwise
// those the kernel computes from `a` itself. One host-to-device copy queued on ctx's stream: call
// it outside a capture, before the replay. CUDA only.
constexpr std::int64_t kAdamWScalars = 8;
void adamw_upload_scalars(Context& ctx, const AdamWStep& a, Tensor& scalars);

}  // namespace lmscale::ops
