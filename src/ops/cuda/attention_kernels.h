#pragma once
// Kernel parameters and launchers shared by the CUDA attention files (flash_attention_fwd.cu,
// flash_attention_bwd.cu, flash_attention_simt.cu, attention_naive.cu). Internal to ops/cuda.
#include <cuda_runtime.h>

#include <cstdint>

namespace lmscale::ops::cuda::attn {

// One attention call's geometry. Element (b, h, t, e) of Q, K, V, O, dO, dQ, dK, dV is at
// b*stride_b + h*stride_h + t*stride_t + e; lse and D (= rowsum(dO*O)) are fp32 [B, H, T].
struct Params {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;      // backward only
  const void* dout = nullptr;   // backward only
  void* out = nullptr;          // forward: O; backward: unused
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* lse = nullptr;         // natural-log logsumexp of the scaled scores per query row
  float* dsum = nullptr;        // backward: D = rowsum(dO * O)
  float* dq_accum = nullptr;    // backward, tensor cores: fp32 dQ accumulator [B*H, T, head_dim], contiguous
  int batch = 1, heads = 1, seq = 1, head_dim = 64;
  long long stride_b = 0, stride_h = 0, stride_t = 0;
  float scale = 1.f;            // softmax scale
  bool causal = true;
};

enum class Elem { f32, bf16, f16 };

// Error reporting for the .cu files, defined in flash_attention.cpp (host C++): the kernels'
// translation units stay free of fmt, whose compile-time format checks nvcc cannot evaluate.
void check_cuda(cudaError_t err, const char* what, const char* file, int line);   // throws lmscale::Error
[[noreturn]] void throw_unsupported_head_dim(int head_dim);
[[noreturn]] void throw_error(const char* message);
#define LMSCALE_ATTN_CUDA_CHECK(expr) ::lmscale::ops::cuda::attn::check_cuda((expr), #expr, __FILE__, __LINE__)
#define LMSCALE_ATTN_CHECK_LAUNCH() LMSCALE_ATTN_CUDA_CHECK(cudaGetLastError())

// Tensor-core kernels (bf16/f16; head_dim 16/32/64/128; rows 16-byte aligned).
void launch_flash_fwd_mma(const Params& p, Elem e, cudaStream_t stream);
void launch_flash_bwd_mma(const Params& p, Elem e, cudaStream_t stream);
// Tile-shape variants of the above for tuning (head_dim 64; 0 = the default the public op uses).
void launch_flash_fwd_mma_variant(const Params& p, Elem e, cudaStream_t stream, int variant);
void launch_flash_bwd_mma_variant(const Params& p, Elem e, cudaStream_t stream, int variant);
// CUDA-core kernels (any of the three element types; head_dim 16/32/64/128).
void launch_flash_fwd_simt(const Params& p, Elem e, cudaStream_t stream);
void launch_flash_bwd_simt(const Params& p, Elem e, cudaStream_t stream);
// Naive attention's row kernels, in place on [rows, T] matrices in the input dtype: softmax of
// the scaled scores (causal: row t keeps keys 0..t) and dS = P * (dP - rowsum(P * dP)).
void launch_naive_softmax(Elem e, cudaStream_t stream, void* probs, long long rows, long long T, bool causal);
void launch_naive_softmax_backward(Elem e, cudaStream_t stream, const void* probs, void* dp, long long rows,
                                   long long T);
// D = rowsum(dO * O) in fp32 (first step of both backward paths).
void launch_flash_bwd_dsum(const Params& p, Elem e, cudaStream_t stream);

}  // namespace lmscale::ops::cuda::attn
