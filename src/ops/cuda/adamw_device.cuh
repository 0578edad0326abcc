#pragma once
// AdamW's device side shared by the plain update (adamw.cu) and the update that casts the FP8
// GEMM weights in the same pass (adamw_fp8.cu): the step's scalars, their device-resident form
// under CUDA graphs, the update of one element, and where a chunk's gradients are.
#include <cmath>
#include <cstdint>

#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "lmscale/ops/device_step.h"

namespace lmscale::ops::cuda::adamw_device {

constexpr int kThreads = 256;
constexpr int kUnroll = 2;   // chunks of kChunk parameters per thread and iteration

struct AdamWScalars {
  float decay;        // 1 - lr * wd
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float step_size;    // lr * sqrt(1 - b2^t) / (1 - b1^t)
  float eps;
  float grad_scale;
};
static_assert(sizeof(AdamWScalars) == kAdamWScalars * sizeof(float), "ops::kAdamWScalars floats");

// A captured step's scalars in device memory (ops/device_step.h): null pointers in an eager step.
struct DeviceStep {
  const AdamWScalars* scalars;   // adamw_upload_scalars
  const double* clip;            // clip_grad_scale: [kClipSlots]
};

// The step's scalars: the launch's own, or (a captured step) the device's with the clipped
// gradient scale rounded to float as the host rounds it. False: a non-finite norm, no update.
__device__ __forceinline__ bool step_scalars(const DeviceStep& dev, AdamWScalars& s) {
  if (!dev.scalars) return true;
  if (dev.clip[kClipFinite] == 0.0) return false;
  s = *dev.scalars;
  s.grad_scale = __double2float_rn(dev.clip[kClipGradScale]);
  return true;
}

// Every rounding is spelled out with the _rn intrinsics, which ptxas never contracts or
// re-associates: the host AdamW of parallel.offload (ops/host_adamw.h, cuda_kernel arithmetic)
// performs the same operations in the same order, so the two agree bit for bit whatever the
// compiler versions. (Written as plain expressions, nvcc and ptxas chose the fma contractions
// per instantiation, and the host could not follow them.)
__device__ __forceinline__ void adamw_update(float& p, float g, float& m, float& v, const AdamWScalars& s) {
  g = __fmul_rn(g, s.grad_scale);
  m = __fmaf_rn(s.one_minus_beta1, g, __fmul_rn(s.beta1, m));                 // b1 m + (1-b1) g
  v = __fmaf_rn(__fmul_rn(s.one_minus_beta2, g), g, __fmul_rn(s.beta2, v));   // b2 v + (1-b2) g^2
  const float d = __fdiv_rn(__fmul_rn(s.step_size, m), __fadd_rn(__fsqrt_rn(v), s.eps));
  p = __fmaf_rn(s.decay, p, -d);                                               // (1 - lr wd) p - d
}

// Where chunk c's gradients are: one tensor, or the pieces of one buffer (ops::adamw_pieces).
struct OneGrad {
  const float* grad;
  __device__ const float* chunk(std::int64_t c) const { return grad + c * kChunk; }
};
constexpr int kMaxPieces = 64;   // per launch: the table travels in the kernel's parameters (1 KB)
struct GradPieces {
  int count;
  std::int64_t first_chunk[kMaxPieces];   // ascending; piece i covers [first_chunk[i], first_chunk[i + 1])
  const float* grad[kMaxPieces];
  __device__ const float* chunk(std::int64_t c) const {
    int lo = 0, hi = count - 1;   // the last piece starting at or before c
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (first_chunk[mid] <= c) lo = mid;
      else hi = mid - 1;
    }
    return grad[lo] + (c - first_chunk[lo]) * kChunk;
  }
};

// Low = void: no working copy. Elements past chunks * kChunk (OneGrad only) one per thread.

inline AdamWScalars scalars(const AdamWStep& a) {
  const double t = static_cast<double>(a.step);
  AdamWScalars s;
  s.decay = static_cast<float>(1.0 - a.lr * a.weight_decay);
  s.beta1 = static_cast<float>(a.beta1);
  s.beta2 = static_cast<float>(a.beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - a.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - a.beta2);
  s.step_size = static_cast<float>(a.lr * std::sqrt(1.0 - std::pow(a.beta2, t)) / (1.0 - std::pow(a.beta1, t)));
  s.eps = static_cast<float>(a.eps);
  s.grad_scale = static_cast<float>(a.grad_scale);
  return s;
}

// The device scalars of a captured step (null pointers in an eager one), checked.
inline DeviceStep device_step(const AdamWStep& a) {
  if (!a.device_scalars) return {nullptr, nullptr};
  LMSCALE_CHECK(a.device_clip && a.device_scalars->device() == Device::cuda && a.device_clip->device() == Device::cuda &&
                    a.device_scalars->dtype() == DType::f32 && a.device_scalars->numel() == kAdamWScalars &&
                    a.device_clip->dtype() == DType::f64 && a.device_clip->numel() == kClipSlots,
                "adamw: device scalars must be f32 [{}] and f64 [{}] on the GPU (ops/device_step.h)", kAdamWScalars,
                kClipSlots);
  return {a.device_scalars->data_as<const AdamWScalars>(), a.device_clip->data_as<const double>()};
}


}  // namespace lmscale::ops::cuda::adamw_device
