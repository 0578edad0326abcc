#pragma once
// Kernel parameters and launchers shared by the CUDA attention files (flash_attention_fwd.cu,
// flash_attention_bwd.cu, flash_attention_simt.cu, attention_naive.cu). Internal to ops/cuda.
#include <cuda_runtime.h>

#include <cstdint>

namespace lmscale::ops::cuda::attn {

// One attention call's geometry. Element (b, h, t, e) of Q, K, V, dQ, dK, dV is at
// b*stride_b + h*stride_h + t*stride_t + e, of O and dO at b*o_stride_b + h*o_stride_h +
// t*o_stride_t + e (the model's q, k, v are column blocks of [N, 3*dl] rows, o and dO [N, dl]);
// lse and D (= rowsum(dO*O)) are fp32 [B, H, T].
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
  float* dq_accum = nullptr;    // backward, tensor cores: fp32 dQ accumulator [B*H, T, padded_head_dim(head_dim)]
  float* lse_log2 = nullptr;    // backward, sm90: lse * log2(e) and D in rows padded to 64 queries,
                                // [B*H, seq_pad] each (flash_attention_sm90_bwd.cu), zeros past seq
  int batch = 1, heads = 1, seq = 1, head_dim = 64;
  long long stride_b = 0, stride_h = 0, stride_t = 0;          // q, k, v, dq, dk, dv
  long long o_stride_b = 0, o_stride_h = 0, o_stride_t = 0;    // o (out), dout
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

// Head dims of the CUDA flash kernels: any 1..kMaxFlashHeadDim on CUDA cores (fp32, or layouts the
// tensor cores cannot take), multiples of 8 up to kMaxFlashHeadDim on tensor cores. The tensor-core
// kernels are compiled for padded widths (multiples of 16 up to 128, of 32 up to 256) and
// zero-fill the columns past the real head dim.
constexpr int kMaxFlashHeadDim = 256;
__host__ __device__ constexpr int padded_head_dim(int d) {
  return d < 1 || d > kMaxFlashHeadDim ? 0 : d <= 128 ? (d + 15) / 16 * 16 : (d + 31) / 32 * 32;
}

// Tensor-core kernels (bf16/f16; head_dim a multiple of 8 up to 256; rows 16-byte aligned).
void launch_flash_fwd_mma(const Params& p, Elem e, cudaStream_t stream);
void launch_flash_bwd_mma(const Params& p, Elem e, cudaStream_t stream);
// Variants of the above for tuning (0 = the default the public op uses; other numbers fall back to
// it). Forward: none at present. Backward: 1 = the deterministic (atomic-free) two-kernel path at
// head dims 16, 32, 64, 128; 2 = 64 queries per step at head dim 160.
void launch_flash_fwd_mma_variant(const Params& p, Elem e, cudaStream_t stream, int variant);
void launch_flash_bwd_mma_variant(const Params& p, Elem e, cudaStream_t stream, int variant);
// The dQ kernel of the deterministic backward (variant 1; flash_attention_bwd_dq.cu): head dims
// 16, 32, 64, 128; needs p.dsum and runs after the dK/dV kernel without the dQ part.
void launch_flash_bwd_dq_deterministic(const Params& p, Elem e, cudaStream_t stream);
// CUDA-core kernels (any of the three element types; any head_dim up to 256).
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
