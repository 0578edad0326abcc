#pragma once
// Hopper (sm_90a) building blocks of the FlashAttention-3 style kernels (flash_attention_sm90_*.cu)
// and the grouped GEMM (grouped_gemm_sm90.cu):
// mbarriers (transaction-count barriers the TMA engine completes), TMA bulk tensor copies, shared-
// memory matrix descriptors for wgmma (wgmma_ops.cuh), the wgmma fences, named barriers between
// warpgroups, and register reallocation between producer and consumer warpgroups.
//
// Shared-memory tiles are written by TMA with the 128-byte swizzle and read by wgmma through
// descriptors of the same swizzle. A tile of R rows x 64 16-bit elements (128 bytes per row) is
// one "column block"; rows of 8 form a 1024-byte swizzle atom, so every column block starts on a
// 1024-byte boundary. A tile of head dim 128 is two column blocks one after the other.
//   K-major operand (rows = M or N, the 64 elements along K): descriptor start = the row group's
//     address + 32 bytes per k16 step inside the column block, stride byte offset (SBO) = 1024
//     (next 8 rows), leading byte offset unused (1).
//   M/N-major operand (rows = K, the 64 elements along M or N): start = + 2048 bytes per k16 step
//     (16 rows), SBO = 1024 (the second 8 rows of the step), LBO = the distance between column
//     blocks (next 64 elements of M or N).
// (The canonical layouts of CUTLASS's make_gmma_desc, cute/atom/mma_traits_sm90_gmma.hpp.)
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lmscale::ops::cuda::sm90 {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LMSCALE_SM90_DEVICE 1
#endif

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ---------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}
// Makes the initialised barriers visible to the other threads and to the TMA (async) proxy.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of TMA transactions for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Waits until the phase of parity `parity` has completed. A fresh barrier is in phase 0: waiting
// for parity 1 returns at once (the producer's first pass over "empty" barriers).
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// ---- TMA ----------------------------------------------------------------------------------------
// A 4-D box [1, 1, rows, 64] of the tensor map at element coordinates (c0 = column, c1 = row,
// c2 = head, c3 = batch) into shared memory; completes `bar`'s transactions. Rows past the tensor's
// end are zero-filled by the engine.
__device__ __forceinline__ void tma_load_4d(void* smem_dst, const CUtensorMap* map, std::uint64_t* bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(smem_u32(smem_dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// A 3-D box [1, rows, 64] of the tensor map at element coordinates (c0 = column, c1 = row, c2 =
// matrix of a stack) into shared memory; completes `bar`'s transactions (the grouped GEMM).
__device__ __forceinline__ void tma_load_3d(void* smem_dst, const CUtensorMap* map, std::uint64_t* bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(smem_u32(smem_dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
}
// Ordinary shared-memory stores that wgmma or TMA read next: fence into the async proxy (each
// writing thread, before the barrier that orders them).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- wgmma --------------------------------------------------------------------------------------
// Shared-memory matrix descriptor with the 128-byte swizzle (layout type 1 in bits 62-63).
__device__ __forceinline__ std::uint64_t make_desc(std::uint32_t smem_addr, std::uint32_t lbo_bytes,
                                                   std::uint32_t sbo_bytes) {
  std::uint64_t d = 0;
  d |= static_cast<std::uint64_t>((smem_addr & 0x3FFFF) >> 4);
  d |= static_cast<std::uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= static_cast<std::uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= static_cast<std::uint64_t>(1) << 62;
  return d;
}
// K-major: rows of 128 bytes along K; `addr` already includes the k-step's 32-byte offset.
__device__ __forceinline__ std::uint64_t desc_k_major(std::uint32_t addr) { return make_desc(addr, 16, 1024); }
// M/N-major: `addr` includes the k-step's 2048-byte offset; `block_bytes` = distance between
// 64-element column blocks along M/N.
__device__ __forceinline__ std::uint64_t desc_mn_major(std::uint32_t addr, std::uint32_t block_bytes) {
  return make_desc(addr, block_bytes, 1024);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins accumulator registers around asynchronous wgmma: the compiler may not move their reads or
// writes across this point.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(std::uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// 2^x in one MUFU.EX2 (flush-to-zero, ~2 ulp): exp2f adds a range check and two multiplies per
// element for results below 2^-126, which the softmax rounds to zero anyway.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- warpgroups -----------------------------------------------------------------------------------
// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads: sync waits, arrive does not.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Register reallocation (takes effect because the kernels declare __launch_bounds__(threads, 1)).
template <int kRegs>
__device__ __forceinline__ void regs_dealloc() {
#ifdef LMSCALE_SM90_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void regs_alloc() {
#ifdef LMSCALE_SM90_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

}  // namespace lmscale::ops::cuda::sm90
