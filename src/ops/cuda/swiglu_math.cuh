#pragma once
// SwiGLU's elementwise arithmetic in fp32, shared by its kernels (swiglu.cu) and the FP8 casts
// fused into them (fp8_producers.cu), which must compute bitwise the same values.

namespace lmscale::ops::cuda {

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

// h = silu(a) * b.
__device__ __forceinline__ float swiglu_value(float a, float b) { return a * sigmoid(a) * b; }

// da = dh * b * silu'(a), silu'(a) = s (1 + a (1 - s)); db = dh * silu(a).
__device__ __forceinline__ void swiglu_grad(float a, float b, float dh, float& da, float& db) {
  const float s = sigmoid(a);
  da = dh * b * s * (1.f + a * (1.f - s));
  db = dh * a * s;
}

}  // namespace lmscale::ops::cuda
