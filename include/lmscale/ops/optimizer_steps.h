#pragma once
// The element-wise updates and per-parameter norms of the optimizers beside AdamW (ops.h holds
// AdamW's fused step): momentum SGD (SGD and LARS share it), LAMB's moments and update, and the
// per-span sums of squares the layer-wise trust ratios need. Every function has a CPU version
// (fp32, fp64; the fp64 one is the test reference) and a CUDA version (fp32 master buffers; the
// updates write the bf16/fp16 working copy in the same pass, as AdamW does). param, grad and the
// state tensors are flat and share a dtype and a size.
#include <cstdint>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"

namespace lmscale::ops {

// ---- momentum SGD ---------------------------------------------------------------------------
//   g   = grad * grad_scale + weight_decay * p        (L2-coupled decay, torch.optim.SGD)
//   buf = momentum * buf + coeff * g
//   d   = nesterov ? coeff * g + momentum * buf : buf
//   p  -= step * d
// SGD (torch.optim.SGD with dampening 0): coeff = 1, step = lr. LARS (You et al. 2017, eq. in
// Algorithm 1: v = m v + gamma lambda (g + beta w); w -= v): coeff = lr * trust_ratio, step = 1.
// A zero buffer makes the first step buf = coeff * g, which is torch's "buf = g.clone()".
struct MomentumStep {
  double momentum = 0.9, weight_decay = 0.0, grad_scale = 1.0;
  double coeff = 1.0, step = 1e-3;
  bool nesterov = false;
};
void momentum_update(Context& ctx, Tensor& param, const Tensor& grad, Tensor& buf, const MomentumStep& s,
                     Tensor* param_lowp);

// ---- LAMB (You et al. 2019, Algorithm 2) -------------------------------------------------------
//   moments:  g = grad * grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   update:   r = (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps);  p -= lr_ratio * (r + weight_decay * p)
// with lr_ratio = lr * trust ratio of the parameter (the caller computes it from lamb_norms).
struct LambStep {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-6, weight_decay = 0.0, grad_scale = 1.0;
  double lr_ratio = 0.0;
  std::int64_t step = 1;   // t, 1-based
};
void lamb_moments(Context& ctx, const Tensor& grad, Tensor& m, Tensor& v, const LambStep& s);
void lamb_update(Context& ctx, Tensor& param, const Tensor& m, const Tensor& v, const LambStep& s, Tensor* param_lowp);

// ---- per-span norms for the trust ratios --------------------------------------------------------
// A span is a contiguous range of the flat tensors that belongs to one parameter (or to the piece
// of it this rank holds). Sums are accumulated in double on the CPU; on CUDA each span's fixed
// set of blocks writes fp32 partials that the host adds in double in a fixed order
// (deterministic). One wait for the device per call.
struct Span {
  std::int64_t offset = 0, numel = 0;
};
// LARS: out[2s] = sum p^2, out[2s+1] = sum (grad * grad_scale)^2 over span s.
std::vector<double> lars_norms(Context& ctx, const Tensor& param, const Tensor& grad, double grad_scale,
                               const std::vector<Span>& spans);
// LAMB (after lamb_moments): out[3s] = sum p^2, out[3s+1] = sum r^2, out[3s+2] = sum r p, with r as
// in lamb_update; ||r + wd p||^2 = r.r + 2 wd r.p + wd^2 p.p, so the norms do not depend on the
// span's weight decay.
std::vector<double> lamb_norms(Context& ctx, const Tensor& param, const Tensor& m, const Tensor& v, const LambStep& s,
                               const std::vector<Span>& spans);

}  // namespace lmscale::ops
