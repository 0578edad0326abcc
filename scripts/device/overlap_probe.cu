// Standalone probe (not part of the build; scripts/device/session_s8.sh `probe` compiles and runs
// it): can a memory-bound AdamW run beside compute-bound GEMMs and save time? Issue 17 part 2 asks
// for the one-GPU step's AdamW (15.4 ms, memory-bound) to overlap the backward (GEMM-bound).
// One stream runs R bf16 GEMMs of the xl FFN shape ([2048 x 1600] x [1600 x 6400], cuBLAS, with
// cublasSetSmCountTarget = SMs - k); a low-priority stream runs AdamW (the kernel of
// ops/cuda/adamw.cu: 2 chunks of 8 parameters per thread and iteration, bf16 copy) over 1e9
// parameters with k blocks of 1024 threads (one per SM: its registers fill the SM, so the GEMM's
// CTAs go elsewhere), or the full grid (k = 0). Printed, medians of 5 CUDA-event timings: GEMMs
// alone, AdamW alone, both together (from the first launch until both streams are done), and the
// saving against running them one after the other at full width.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

struct S { float decay, beta1, beta2, omb1, omb2, step_size, eps, gs; };
__device__ __forceinline__ void upd(float& p, float g, float& m, float& v, const S& s) {
  g *= s.gs; p *= s.decay; m = s.beta1 * m + s.omb1 * g; v = s.beta2 * v + s.omb2 * g * g;
  p -= s.step_size * m / (sqrtf(v) + s.eps);
}
__device__ __forceinline__ void ld8(const float* p, float* x) {
  float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
}
__device__ __forceinline__ void st8(float* p, const float* x) {
  *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(x[4], x[5], x[6], x[7]);
}
template <int U, int kBlock>
__global__ void __launch_bounds__(kBlock) adamw(float* __restrict__ P, const float* __restrict__ G, float* __restrict__ M, float* __restrict__ V,
                      __nv_bfloat16* __restrict__ L, long long chunks, S s) {
  const long long stride = (long long)gridDim.x * blockDim.x * U;
  for (long long c = (long long)blockIdx.x * blockDim.x * U + threadIdx.x; c < chunks; c += stride) {
    float p[U][8], g[U][8], m[U][8], v[U][8];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long cc = c + (long long)u * blockDim.x;
      if (cc >= chunks) continue;
      ld8(P + cc * 8, p[u]); ld8(G + cc * 8, g[u]); ld8(M + cc * 8, m[u]); ld8(V + cc * 8, v[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long cc = c + (long long)u * blockDim.x;
      if (cc >= chunks) continue;
#pragma unroll
      for (int e = 0; e < 8; ++e) upd(p[u][e], g[u][e], m[u][e], v[u][e], s);
      st8(P + cc * 8, p[u]); st8(M + cc * 8, m[u]); st8(V + cc * 8, v[u]);
      __nv_bfloat162 b[4];
      for (int e = 0; e < 4; ++e) b[e] = __floats2bfloat162_rn(p[u][2 * e], p[u][2 * e + 1]);
      *reinterpret_cast<uint4*>(L + cc * 8) = *reinterpret_cast<uint4*>(b);
    }
  }
}


int main() {
  const long long NP = 1000000000LL, chunks = NP / 8;
  float *p, *g, *m, *v; __nv_bfloat16* l;
  cudaMalloc(&p, NP * 4); cudaMalloc(&g, NP * 4); cudaMalloc(&m, NP * 4); cudaMalloc(&v, NP * 4); cudaMalloc(&l, NP * 2);
  cudaMemset(p, 0, NP * 4); cudaMemset(g, 0, NP * 4); cudaMemset(m, 0, NP * 4); cudaMemset(v, 0, NP * 4);
  const S s{0.999f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-4f, 1e-8f, 1.f};
  const int Mr = 2048, K = 1600, N = 6400, R = 250;
  __nv_bfloat16 *A, *B, *C;
  cudaMalloc(&A, (size_t)Mr * K * 2); cudaMalloc(&B, (size_t)K * N * 2); cudaMalloc(&C, (size_t)Mr * N * 2);
  cudaMemset(A, 0, (size_t)Mr * K * 2); cudaMemset(B, 0, (size_t)K * N * 2);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int lo, hi; cudaDeviceGetStreamPriorityRange(&lo, &hi);
  cudaStream_t s1, s2;
  cudaStreamCreateWithPriority(&s1, cudaStreamNonBlocking, hi);
  cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, lo);
  cublasHandle_t h; cublasCreate(&h); cublasSetStream(h, s1);
  const float one = 1, zero = 0;
  auto gemms = [&](int target) {
    cublasSetSmCountTarget(h, target);
    for (int r = 0; r < R; ++r)
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, Mr, K, &one, B, CUDA_R_16BF, K, A, CUDA_R_16BF, K, &zero, C,
                   CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  auto opt = [&](int k) {   // k = 0: the library's grid (4 blocks of 256 per SM)
    if (k == 0) adamw<2, 256><<<sms * 4, 256, 0, s2>>>(p, g, m, v, l, chunks, s);
    else adamw<2, 1024><<<k, 1024, 0, s2>>>(p, g, m, v, l, chunks, s);
  };
  cudaEvent_t e0, e1, e2;
  cudaEventCreate(&e0); cudaEventCreate(&e1); cudaEventCreate(&e2);
  // Median over 5 (after one warm-up) of the time from e0 until both streams are done.
  auto timeit = [&](const std::function<void()>& body) {
    std::vector<float> t;
    for (int i = 0; i < 6; ++i) {
      cudaDeviceSynchronize();
      cudaEventRecord(e0, s1);
      cudaStreamWaitEvent(s2, e0);
      body();
      cudaEventRecord(e1, s2);
      cudaStreamWaitEvent(s1, e1);
      cudaEventRecord(e2, s1);
      cudaEventSynchronize(e2);
      float ms; cudaEventElapsedTime(&ms, e0, e2);
      if (i) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const float g_full = timeit([&] { gemms(0); });
  const float a_full = timeit([&] { opt(0); });
  printf("SMs %d; %d GEMMs %dx%dx%d bf16: %.3f ms (%.0f TFLOP/s); AdamW 1e9 params full grid: %.3f ms (%.2f TB/s)\n",
         sms, R, Mr, N, K, g_full, 2.0 * Mr * N * K * R / (g_full * 1e-3) / 1e12, a_full, 30.0 * NP / (a_full * 1e-3) / 1e12);
  printf("serial (full width, one after the other): %.3f ms\n", g_full + a_full);
  const float both_full = timeit([&] { opt(0); gemms(0); });
  printf("k  0 (both full grids, AdamW low priority, launched first): together %.3f ms, saving %+.1f%%\n", both_full,
         100.0 * (1 - both_full / (g_full + a_full)));
  for (int k : {8, 16, 24, 32, 48, 66}) {
    const float gk = timeit([&] { gemms(sms - k); });
    const float ak = timeit([&] { opt(k); });
    const float both = timeit([&] { opt(k); gemms(sms - k); });
    printf("k %2d: GEMMs on %d SMs alone %.3f ms (+%.1f%%); AdamW on %d SMs alone %.3f ms (%.2f TB/s); together %.3f ms, "
           "saving %+.1f%% vs serial full width\n",
           k, sms - k, gk, 100.0 * (gk / g_full - 1), k, ak, 30.0 * NP / (ak * 1e-3) / 1e12, both,
           100.0 * (1 - both / (g_full + a_full)));
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
