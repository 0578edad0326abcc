#pragma once
// AdamW on the host for optimizer offload (docs/parallel.md, "CPU offload: parallel.offload"):
// the fp32 master, m and v of what a rank owns live in host memory and the host updates them,
// multithreaded and vectorised (AVX2 + FMA when the CPU has them, else scalar), writing the
// bf16/fp16 working copy in the same pass.
//
// The arithmetic reproduces, element for element, the AdamW of the device the run trains on, so
// offloading the optimizer does not change a run's numbers:
// - AdamWArithmetic::cuda_kernel is src/ops/cuda/adamw.cu, whose update spells every rounding
//   with the _rn intrinsics (which neither nvcc nor ptxas contracts or re-associates):
//     g  = grad * grad_scale
//     m  = fma(1-beta1, g, beta1 * m)
//     v  = fma((1-beta2) * g, g, beta2 * v)
//     d  = (step_size * m) / (sqrt(v) + eps)   IEEE sqrt and division
//     p  = fma(decay, p, -d)                   decay = 1 - lr*wd
//   The host calls std::fma (or _mm256_fmadd_ps) at exactly those places and rounds every other
//   operation separately, with no flush to zero on either side.
// - AdamWArithmetic::cpu_reference is ops::adamw on the CPU (src/ops/cpu/adamw.cpp): every
//   operation rounded separately, `p -= (lr*wd) * p` first. This file is compiled with
//   -ffp-contract=off so the compiler adds no fma of its own.
// The scalars (decay, step_size = lr*sqrt(1-b2^t)/(1-b1^t), ...) are computed in double and
// rounded to float once, as both device versions do.
#include <cstdint>

#include "lmscale/core/tensor.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops {

enum class AdamWArithmetic { cuda_kernel, cpu_reference };

// param, grad, m, v: fp32 host tensors of one size (flat views are fine); param_lowp, when given,
// a host bf16 or fp16 tensor of that size receiving the updated parameter (one round to nearest
// even). threads >= 1: the range is split into that many contiguous parts, one per thread.
void adamw_host(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& a, Tensor* param_lowp,
                AdamWArithmetic arithmetic, int threads);

// Whether adamw_host takes the AVX2 + FMA path on this CPU (tests and the offload log line).
bool adamw_host_vectorised();

}  // namespace lmscale::ops
