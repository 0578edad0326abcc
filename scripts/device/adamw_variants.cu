// Standalone AdamW bandwidth experiment (not part of the build; scripts/device/session_s5.sh
// adamw compiles and runs it): copies of the fused AdamW kernel (ops/cuda/adamw.cu) with U chunks
// of 8 parameters per thread and iteration, blocks per SM and cache hints varied, over 2e9 fp32
// parameters with a bf16 copy (30 B per parameter); medians of 5 CUDA-event timings, and a
// device-to-device memcpy for the ceiling. "base" is the kernel before 2026-11-26 (U = 1, 4 blocks
// per SM); the kernel now is U = 2, 4 blocks per SM.
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cstdint>
struct S { float decay, beta1, beta2, omb1, omb2, step_size, eps, gs; };
__device__ __forceinline__ void upd(float& p, float g, float& m, float& v, const S& s) {
  g *= s.gs; p *= s.decay; m = s.beta1 * m + s.omb1 * g; v = s.beta2 * v + s.omb2 * g * g;
  p -= s.step_size * m / (sqrtf(v) + s.eps);
}
template <int kHint>
__device__ __forceinline__ float4 ld4(const float* p) {
  if constexpr (kHint == 1) return __ldcs(reinterpret_cast<const float4*>(p));
  else if constexpr (kHint == 2) return __ldlu(reinterpret_cast<const float4*>(p));
  else return *reinterpret_cast<const float4*>(p);
}
template <int kHint>
__device__ __forceinline__ void st4(float* p, float4 v) {
  if constexpr (kHint == 1) __stcs(reinterpret_cast<float4*>(p), v);
  else *reinterpret_cast<float4*>(p) = v;
}
// U chunks of 8 per thread per iteration
template <int U, int kHint>
__global__ void adamw(float* __restrict__ P, const float* __restrict__ G, float* __restrict__ M, float* __restrict__ V,
                      __nv_bfloat16* __restrict__ L, long long chunks, S s) {
  const long long stride = (long long)gridDim.x * blockDim.x * U;
  for (long long c = (long long)blockIdx.x * blockDim.x * U + threadIdx.x; c < chunks; c += stride) {
    float p[U][8], g[U][8], m[U][8], v[U][8];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long cc = c + (long long)u * blockDim.x;
      if (cc >= chunks) continue;
      const long long o = cc * 8;
      float4 a;
      a = ld4<kHint>(P + o); p[u][0]=a.x; p[u][1]=a.y; p[u][2]=a.z; p[u][3]=a.w; a = ld4<kHint>(P + o + 4); p[u][4]=a.x; p[u][5]=a.y; p[u][6]=a.z; p[u][7]=a.w;
      a = ld4<kHint>(G + o); g[u][0]=a.x; g[u][1]=a.y; g[u][2]=a.z; g[u][3]=a.w; a = ld4<kHint>(G + o + 4); g[u][4]=a.x; g[u][5]=a.y; g[u][6]=a.z; g[u][7]=a.w;
      a = ld4<kHint>(M + o); m[u][0]=a.x; m[u][1]=a.y; m[u][2]=a.z; m[u][3]=a.w; a = ld4<kHint>(M + o + 4); m[u][4]=a.x; m[u][5]=a.y; m[u][6]=a.z; m[u][7]=a.w;
      a = ld4<kHint>(V + o); v[u][0]=a.x; v[u][1]=a.y; v[u][2]=a.z; v[u][3]=a.w; a = ld4<kHint>(V + o + 4); v[u][4]=a.x; v[u][5]=a.y; v[u][6]=a.z; v[u][7]=a.w;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long cc = c + (long long)u * blockDim.x;
      if (cc >= chunks) continue;
      const long long o = cc * 8;
#pragma unroll
      for (int e = 0; e < 8; ++e) upd(p[u][e], g[u][e], m[u][e], v[u][e], s);
      st4<kHint>(P + o, make_float4(p[u][0], p[u][1], p[u][2], p[u][3])); st4<kHint>(P + o + 4, make_float4(p[u][4], p[u][5], p[u][6], p[u][7]));
      st4<kHint>(M + o, make_float4(m[u][0], m[u][1], m[u][2], m[u][3])); st4<kHint>(M + o + 4, make_float4(m[u][4], m[u][5], m[u][6], m[u][7]));
      st4<kHint>(V + o, make_float4(v[u][0], v[u][1], v[u][2], v[u][3])); st4<kHint>(V + o + 4, make_float4(v[u][4], v[u][5], v[u][6], v[u][7]));
      __nv_bfloat162 b[4];
      for (int e = 0; e < 4; ++e) b[e] = __floats2bfloat162_rn(p[u][2*e], p[u][2*e+1]);
      *reinterpret_cast<uint4*>(L + o) = *reinterpret_cast<uint4*>(b);
    }
  }
}
int main() {
  const long long P = 2000000000LL, chunks = P / 8;
  float *p, *g, *m, *v; __nv_bfloat16* l;
  cudaMalloc(&p, P * 4); cudaMalloc(&g, P * 4); cudaMalloc(&m, P * 4); cudaMalloc(&v, P * 4); cudaMalloc(&l, P * 2);
  cudaMemset(p, 0, P * 4); cudaMemset(g, 0, P * 4); cudaMemset(m, 0, P * 4); cudaMemset(v, 0, P * 4);
  S s{0.999f, 0.9f, 0.95f, 0.1f, 0.05f, 1e-4f, 1e-8f, 1.f};
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  auto run = [&](const char* name, auto kernel, int bps, int U) {
    const unsigned grid = sms * bps;
    std::vector<float> t;
    for (int i = 0; i < 6; ++i) {
      cudaEventRecord(a); kernel<<<grid, 256>>>(p, g, m, v, l, chunks, s); cudaEventRecord(b); cudaEventSynchronize(b);
      float ms; cudaEventElapsedTime(&ms, a, b); if (i) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    printf("%-40s bps %d U %d: %8.3f ms  %7.1f GB/s\n", name, bps, U, t[t.size()/2], 30.0 * P / (t[t.size()/2] * 1e-3) / 1e9);
  };
  run("base (U1, plain)", adamw<1, 0>, 4, 1);
  for (int bps : {2, 3, 4, 6}) { run("U2", adamw<2, 0>, bps, 2); run("U3", adamw<3, 0>, bps, 3); }
  run("base (U1, plain) again", adamw<1, 0>, 4, 1);
  run("U2 again", adamw<2, 0>, 4, 2);
  // reference: device copy bandwidth
  std::vector<float> t;
  for (int i = 0; i < 6; ++i) { cudaEventRecord(a); cudaMemcpyAsync(m, p, P * 4, cudaMemcpyDeviceToDevice); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); if (i) t.push_back(ms); }
  std::sort(t.begin(), t.end());
  printf("memcpy d2d 8 GB: %.3f ms %.1f GB/s (read+write)\n", t[2], 8.0 * P / (t[2] * 1e-3) / 1e9);
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
