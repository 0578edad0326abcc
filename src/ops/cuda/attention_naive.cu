// Naive attention's row kernels (attention_naive_host.cpp runs the GEMMs around them): the
// softmax of each score row and its backward, fp32 math on rows stored in the input dtype, one
// block of 256 threads per row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>

#include "attention_kernels.h"
#include "attention_mma.cuh"

namespace lmscale::ops::cuda::attn {

namespace {

__device__ float block_reduce(float v, bool is_max, float* red) {
  for (int w = 16; w > 0; w >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, w);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();   // red may still be read from the previous reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : (is_max ? -FLT_MAX : 0.f);
  for (int w = 16; w > 0; w >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, w);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  return v;
}

// In place on one row of probs [rows = B*H*T, T]: softmax of the scaled scores; causal rows
// keep keys 0..t and zero the rest.
template <class E>
__global__ void softmax_rows_kernel(E* probs, long long T, bool causal) {
  __shared__ float red[32];
  const long long row = blockIdx.x;
  E* x = probs + row * T;
  const long long valid = causal ? row % T + 1 : T;
  float mx = -FLT_MAX;
  for (long long j = threadIdx.x; j < valid; j += blockDim.x) mx = fmaxf(mx, to_float(x[j]));
  mx = block_reduce(mx, true, red);
  float sum = 0.f;
  for (long long j = threadIdx.x; j < valid; j += blockDim.x) sum += __expf(to_float(x[j]) - mx);
  sum = block_reduce(sum, false, red);
  const float inv = 1.f / sum;
  for (long long j = threadIdx.x; j < T; j += blockDim.x)
    x[j] = from_float<E>(j < valid ? __expf(to_float(x[j]) - mx) * inv : 0.f);
}

// In place on dP: dS = P * (dP - rowsum(P * dP)).
template <class E>
__global__ void softmax_backward_rows_kernel(const E* probs, E* dp, long long T) {
  __shared__ float red[32];
  const long long row = blockIdx.x;
  const E* p = probs + row * T;
  E* d = dp + row * T;
  float dot = 0.f;
  for (long long j = threadIdx.x; j < T; j += blockDim.x) dot += to_float(p[j]) * to_float(d[j]);
  dot = block_reduce(dot, false, red);
  for (long long j = threadIdx.x; j < T; j += blockDim.x) d[j] = from_float<E>(to_float(p[j]) * (to_float(d[j]) - dot));
}

template <class E>
void launch_softmax(cudaStream_t stream, void* probs, long long rows, long long T, bool causal) {
  softmax_rows_kernel<E><<<static_cast<unsigned>(rows), 256, 0, stream>>>(static_cast<E*>(probs), T, causal);
  LMSCALE_ATTN_CHECK_LAUNCH();
}
template <class E>
void launch_softmax_backward(cudaStream_t stream, const void* probs, void* dp, long long rows, long long T) {
  softmax_backward_rows_kernel<E><<<static_cast<unsigned>(rows), 256, 0, stream>>>(static_cast<const E*>(probs),
                                                                                        static_cast<E*>(dp), T);
  LMSCALE_ATTN_CHECK_LAUNCH();
}

}  // namespace

void launch_naive_softmax(Elem e, cudaStream_t stream, void* probs, long long rows, long long T, bool causal) {
  if (e == Elem::f32) launch_softmax<float>(stream, probs, rows, T, causal);
  else if (e == Elem::bf16) launch_softmax<__nv_bfloat16>(stream, probs, rows, T, causal);
  else launch_softmax<__half>(stream, probs, rows, T, causal);
}

void launch_naive_softmax_backward(Elem e, cudaStream_t stream, const void* probs, void* dp, long long rows,
                                   long long T) {
  if (e == Elem::f32) launch_softmax_backward<float>(stream, probs, dp, rows, T);
  else if (e == Elem::bf16) launch_softmax_backward<__nv_bfloat16>(stream, probs, dp, rows, T);
  else launch_softmax_backward<__half>(stream, probs, dp, rows, T);
}

}  // namespace lmscale::ops::cuda::attn
