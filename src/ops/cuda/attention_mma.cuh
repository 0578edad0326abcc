#pragma once
// Warp-level building blocks of the FlashAttention-2 kernels (flash_attention_fwd.cu,
// flash_attention_bwd.cu): mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate), ldmatrix fragment
// loads from padded shared-memory tiles, cp.async tile copies with zero fill, and the element
// conversions. Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
// g = lane/4 and t = lane%4:
//   A 16x16 (4 regs of 2 elements): a0 = A[g][2t..], a1 = A[g+8][2t..], a2 = A[g][2t+8..],
//                                    a3 = A[g+8][2t+8..]
//   B 16x8  (2 regs):               b0 = B[2t..][g],  b1 = B[2t+8..][g]
//   C 16x8  (4 fp32):               c0,c1 = C[g][2t, 2t+1],  c2,c3 = C[g+8][2t, 2t+1]
// Shared tiles are row-major with rows padded by 8 elements (16 bytes), so the 8 row addresses
// of one ldmatrix 8x8 matrix fall in 8 different 16-byte bank groups (no conflicts).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lmscale::ops::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <class E>
__device__ __forceinline__ E from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// Two floats rounded to a packed pair of E (low half = a).
template <class E>
__device__ __forceinline__ std::uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ std::uint32_t pack2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<std::uint32_t*>(&v);
}
template <>
__device__ __forceinline__ std::uint32_t pack2<__half>(float a, float b) {
  __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

// c += a * b for one 16x8x16 tile.
template <class E>
__device__ __forceinline__ void mma16816(float* c, const std::uint32_t* a, const std::uint32_t* b);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float* c, const std::uint32_t* a, const std::uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float* c, const std::uint32_t* a, const std::uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t* r, std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t* r, std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// A fragment of the 16x16 block at (r0, c0) of a row-major tile (row stride `ld` elements).
template <class E>
__device__ __forceinline__ void load_a(std::uint32_t* a, const E* tile, int ld, int r0, int c0) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4(a, smem_addr(tile + (r0 + (lane & 15)) * ld + c0 + (lane >> 4) * 8));
}
// The same from a tile stored transposed, [k][m] (e.g. dS when the tile holds dS^T): transposing
// ldmatrix; matrix i covers m0 + 8*(i&1), k0 + 8*(i>>1).
template <class E>
__device__ __forceinline__ void load_a_km(std::uint32_t* a, const E* tile, int ld, int m0, int k0) {
  const int lane = threadIdx.x & 31, mi = lane >> 3;
  ldmatrix_x4_trans(a, smem_addr(tile + (k0 + (lane & 7) + (mi >> 1) * 8) * ld + m0 + (mi & 1) * 8));
}
// B fragments for two adjacent n-blocks (n0, n0+8), k in [k0, k0+16), from a tile stored [n][k]
// (e.g. K when B = K^T): b[0..1] for n0, b[2..3] for n0+8.
template <class E>
__device__ __forceinline__ void load_b_nk(std::uint32_t* b, const E* tile, int ld, int n0, int k0) {
  const int lane = threadIdx.x & 31, mi = lane >> 3;
  ldmatrix_x4(b, smem_addr(tile + (n0 + (lane & 7) + (mi >> 1) * 8) * ld + k0 + (mi & 1) * 8));
}
// The same from a tile stored [k][n] (e.g. V when B = V): transposing ldmatrix.
template <class E>
__device__ __forceinline__ void load_b_kn(std::uint32_t* b, const E* tile, int ld, int k0, int n0) {
  const int lane = threadIdx.x & 31, mi = lane >> 3;
  ldmatrix_x4_trans(b, smem_addr(tile + (k0 + (lane & 7) + (mi & 1) * 8) * ld + n0 + (mi >> 1) * 8));
}

// 16-byte asynchronous copy global -> shared; src_bytes = 0 writes zeros (rows past the end).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Copies rows [row0, row0 + R) of one head (row stride `gld` elements, `dreal` elements per row,
// a multiple of 8) into a padded shared tile of DP >= dreal columns (row stride DP + 8); rows at
// or past `rows` and columns at or past `dreal` are zero-filled, so products over the DP columns
// equal those over the real ones. All kThreads threads of the block take part.
template <class E, int R, int DP, int kThreads>
__device__ __forceinline__ void load_tile(E* tile, const E* head, long long gld, int row0, int rows, int dreal) {
  constexpr int kChunksPerRow = DP / 8;   // 16-byte chunks
  constexpr int kChunks = R * kChunksPerRow;
#pragma unroll
  for (int c = threadIdx.x; c < kChunks; c += kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool valid = row0 + r < rows && col < dreal;
    const E* src = head + (valid ? static_cast<long long>(row0 + r) * gld + col : 0);
    cp_async16(tile + r * (DP + 8) + col, src, valid);
  }
}

// Quad (4 lanes sharing a row of a C fragment) reductions.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace lmscale::ops::cuda::attn
