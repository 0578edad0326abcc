#pragma once
// Global-norm gradient clipping. The norm is taken over all gradients; strategies that hold only
// a shard of the gradients sum the squares over ranks first (sum_squares + all-reduce).
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"

namespace lmscale::optim {

// Sum of squares of x as a host double (waits for the device).
double sum_of_squares(Context& ctx, const Tensor& x);
// The same over several tensors (gradients kept per bucket), with one wait for the device: the
// host sum, in index order, of sum_of_squares_parts' values.
double sum_of_squares(Context& ctx, const std::vector<Tensor>& parts);
// Each tensor's sum of squares left on the device, [parts.size()] (fp32 on CUDA, fp64 on the
// CPU), with no wait: what ops::clip_grad_scale (ops/device_step.h) takes inside a captured step.
Tensor sum_of_squares_parts(Context& ctx, const std::vector<Tensor>& parts);
// Factor to multiply gradients by so their global norm is at most max_norm (1 when already
// below; max_norm <= 0 disables). The 1e-6 in the denominator follows PyTorch's clip_grad_norm_.
double clip_factor(double global_norm, double max_norm);

}  // namespace lmscale::optim
