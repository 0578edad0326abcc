// FlashAttention backward for Hopper (sm_90a), FlashAttention-3 style: warp-specialized, TMA and
// wgmma, the S^T formulation of our FA2 backward (flash_attention_bwd.cu) moved onto warpgroups.
// One CTA per (128 keys, batch*head), three warpgroups:
// - warpgroup 0, producer: one thread loads the CTA's K and V tiles [128 x D] once and streams
//   Q and dO tiles of 64 query rows through a two-stage mbarrier ring (TMA, 128-byte swizzle).
// - warpgroups 1 and 2, consumers of 64 keys each (rows kw..kw+63 of the K/V tiles). Per query
//   tile, with wgmma:
//     S^T  = K_w Q^T            [64 x 64]   A = K (smem, K-major), B = Q (smem, K-major)
//     dP^T = V_w dO^T           [64 x 64]   A = V,                B = dO
//     P^T  = exp2(S^T * scale * log2e - lse * log2e)   (mask on tiles crossing the diagonal)
//     dV  += P^T dO             [64 x D]    A = P^T (registers),  B = dO (smem, N-major)
//     dS^T = P^T * (dP^T - D)
//     dK  += dS^T Q             [64 x D]    A = dS^T (registers), B = Q (smem, N-major)
//     dS^T of both warpgroups -> shared memory [128 keys x 64 queries] (double-buffered), then
//     dQ_w = dS K[:, half w]    [64 x D/2]  A = dS (smem, M-major), B = K (smem, N-major),
//     staged in shared memory in fragment order and added to the fp32 accumulator by one bulk
//     reduction (cp.reduce.async.bulk .add.f32) that warp 1 of the producer warpgroup issues, so
//     the consumers never wait on atomics (FlashAttention-3's dQ path).
//   The register-A products need no shuffle: wgmma's fp32 accumulator layout is its A-fragment
//   layout. dK is scaled by the softmax scale at the end; dQ by the convert kernel.
// - Order within a query tile: S^T and dP^T issued together; P^T while dP^T runs; dV issued;
//   dS^T while dV runs; dK issued from registers (before the barrier, it needs no other keys);
//   dS^T stored; barrier; dQ. ptxas keeps each chain of wgmmas in flight (3 waits per tile):
//   see the __syncwarp after the dQ-stage wait, without which it serialised every wgmma (C7520)
//   and the backward took 48.5 ms instead of 42.0 at the 8B layer (H100, 2026-11-26).
// - Shared-memory addressing: the dS^T tile stores, the lse2 / D loads and the dQ staging use
//   32-bit shared-window addresses recomputed per access instead of generic pointers, which ptxas
//   hoists out of the loop as invariants (two registers each) and spills.
// - Causal: query tiles wholly before the CTA's first key are never loaded; tiles that reach past
//   a warpgroup's first key are masked (and only those).
// The accumulator is blocked: [B*H, query tiles, 2 halves, 64 x D/2 in fragment order] (see
// dq_block_offset); the convert kernel writes dQ = scale * dQacc in the input layout. dQ's last
// bits depend on the order in which key blocks' reductions arrive (as in the FA2 fused backward).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention_mma.cuh"
#include "flash_attention_sm90.h"
#include "hopper.cuh"
#include "wgmma_ops.cuh"

namespace lmscale::ops::cuda::attn::sm90_bwd {

using namespace lmscale::ops::cuda::sm90;

constexpr int kBN = 128;        // keys per CTA (2 consumer warpgroups x 64)
constexpr int kBM = 64;         // query rows per step
constexpr int kStages = 2;      // Q and dO ring depth
constexpr int kThreads = 384;
constexpr int kConsumerThreads = 256;
constexpr int kDsBarrier = 1;   // named barrier: both halves of dS^T are in shared memory

template <class E, int D>
struct Smem {
  static constexpr int kCB = D / 64;
  alignas(1024) E k[kCB][kBN][64];
  alignas(1024) E v[kCB][kBN][64];
  alignas(1024) E q[kStages][kCB][kBM][64];
  alignas(1024) E dout[kStages][kCB][kBM][64];
  alignas(1024) E ds[2][kBN][64];   // dS^T [keys][queries], 128-byte swizzled
  alignas(128) float dq[2][kBM * D / 2];   // per consumer warpgroup: its dQ half, fragment order
  alignas(16) float lse2[kStages][kBM];   // lse * log2(e) of the query tile (with Q)
  alignas(16) float dsum[kStages][kBM];   // D = rowsum(dO * O) of the query tile (with dO)
  alignas(8) std::uint64_t kv_full;
  std::uint64_t q_full[kStages], do_full[kStages], q_empty[kStages], do_empty[kStages];
  std::uint64_t dq_full[2], dq_empty[2];   // consumer warpgroup w -> dQ writer and back
};

template <class E, int D>
constexpr std::size_t smem_bytes() {
  return sizeof(Smem<E, D>) + 1024;
}

// Stores a consumer thread's 64 x 64 tile of packed A fragments f into rows r and r + 8 of a
// [rows][64] 16-bit tile with the 128-byte swizzle (the tile starts on a 1024-byte boundary; the
// 16-byte chunk index col / 8 is XORed with row % 8 = g). f[kk][0..3] = columns 16kk + 2t (+1) at
// rows r, r + 8, then columns + 8 at rows r, r + 8. 32-bit shared addresses, one XOR per store.
__device__ __forceinline__ void store_fragment_tile(std::uint32_t tile, int r, int g, int t,
                                                    const std::uint32_t (&f)[kBM / 16][4]) {
  const std::uint32_t base = tile + static_cast<std::uint32_t>(r * 128 + 4 * t);
#pragma unroll
  for (int kk = 0; kk < kBM / 16; ++kk)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const std::uint32_t a = base + (static_cast<std::uint32_t>((2 * kk + h) ^ g) << 4);
      asm volatile("st.shared.b32 [%0], %1;\n"
                   "st.shared.b32 [%0+1024], %2;\n" ::"r"(a),
                   "r"(f[kk][2 * h]), "r"(f[kk][2 * h + 1])
                   : "memory");
    }
}

// Rounds a 64 x 64 accumulator tile (wgmma's fp32 layout) to E pairs in A-fragment order:
// f[kk] = columns 16kk + 2t (+1) at rows r, r + 8, then columns + 8 at rows r, r + 8.
template <class E>
__device__ __forceinline__ void pack_fragments(const float (&v)[kBM / 2], std::uint32_t (&f)[kBM / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kBM / 16; ++kk)
#pragma unroll
    for (int x = 0; x < 4; ++x) f[kk][x] = pack2<E>(v[8 * kk + 2 * x], v[8 * kk + 2 * x + 1]);
}

__device__ __forceinline__ float ld_shared_f32(std::uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

// 1-D bulk copy global -> shared (16-byte aligned, size a multiple of 16) completing `bar`.
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* src, unsigned bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(smem_dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// Rows padded to whole query tiles: lse2 = lse * log2(e) and D = rowsum(dO * O), zeros past seq,
// so the producer copies them per tile with one bulk copy each; and the dQ accumulator zeroed (it
// was a separate cudaMemsetAsync). D / 8 threads per padded row, 8 elements (one 16-byte load of
// O and of dO) each, the row's sum over those lanes by shuffles: one warp per row with scalar loads
// took 14.5 us per xl layer (B 4, H 25, T 512, D 64: 13 MB read, 0.9 TB/s) plus the memset.
template <class E, int D>
__global__ void flash_bwd_sm90_prep_kernel(const Params p, int seq_pad) {
  constexpr int kLanes = D / 8;   // threads per row, a power of two dividing 32
  const long long rows = static_cast<long long>(p.batch) * p.heads * seq_pad;
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * kLanes) {   // rows * D floats of accumulator: 8 per thread
    float4* acc = reinterpret_cast<float4*>(p.dq_accum) + 2 * i;
    acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const long long row = i / kLanes;
  const int lane = static_cast<int>(i % kLanes);
  const int t = row < rows ? static_cast<int>(row % seq_pad) : seq_pad;
  const long long bh = row / seq_pad, b = bh / p.heads, h = bh % p.heads;
  float acc = 0.f;
  if (t < p.seq) {
    const long long off = b * p.o_stride_b + h * p.o_stride_h + t * p.o_stride_t + lane * 8;   // O, dO layout
    const uint4 ov = *reinterpret_cast<const uint4*>(static_cast<const E*>(p.o) + off);
    const uint4 dv = *reinterpret_cast<const uint4*>(static_cast<const E*>(p.dout) + off);
    const E* oe = reinterpret_cast<const E*>(&ov);
    const E* de = reinterpret_cast<const E*>(&dv);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += to_float(oe[e]) * to_float(de[e]);
  }
#pragma unroll
  for (int w = kLanes / 2; w > 0; w >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, w);
  if (lane == 0 && row < rows) {
    p.dsum[row] = acc;
    p.lse_log2[row] = t < p.seq ? p.lse[bh * p.seq + t] * kLog2e : 0.f;
  }
}

// dst[0 .. bytes/4) += src[...] in L2 (fp32), one bulk operation; completes in the bulk group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const float* src, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(smem_u32(src)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until the shared-memory sources of every committed bulk operation have been read.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// Blocked dQ accumulator: tile (bh, m_tile, half) holds 64 x D/2 floats in the order the consumer
// threads hold them (thread tid = 32 warp + 4 g + t of the warpgroup, float4 j = column block):
// element (r, c) of the half-tile is at ((c / 8) * 128 + tid) * 4 + 2 * ((r % 16) / 8) + c % 2 with
// warp = r / 16, g = r % 8, t = (c % 8) / 2. The consumers' float4 stores are conflict-free.
__host__ __device__ constexpr long long dq_block_offset(long long bh, int m_tiles, int m_tile, int half, int D) {
  return ((bh * m_tiles + m_tile) * 2 + half) * static_cast<long long>(kBM) * (D / 2);
}

template <class E, int D, bool kCausal>
__global__ void __launch_bounds__(kThreads, 1)
    flash_bwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                          const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                          const Params p) {
#ifdef LMSCALE_SM90_DEVICE
  constexpr bool kF16 = std::is_same_v<E, __half>;
  constexpr int kCB = D / 64;
  constexpr int kQBytes = kBM * D * static_cast<int>(sizeof(E));
  extern __shared__ unsigned char smem_raw[];
  auto& s = *reinterpret_cast<Smem<E, D>*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~std::uintptr_t(1023));

  const int n_block = static_cast<int>(blockIdx.x);   // causal: the first key tiles have the most work
  const int bh = static_cast<int>(blockIdx.y), b = bh / p.heads, h = bh % p.heads;
  const int n0 = n_block * kBN;
  const int m_begin = kCausal ? n0 / kBM : 0;
  const int m_end = (p.seq + kBM - 1) / kBM;
  const int steps = m_end - m_begin;
  const int seq_pad = m_end * kBM;
  const int wg = static_cast<int>(threadIdx.x) / 128;

  if (threadIdx.x == 0) {
    mbar_init(&s.kv_full, 1);
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&s.q_full[i], 1);
      mbar_init(&s.do_full[i], 1);
      mbar_init(&s.q_empty[i], kConsumerThreads);
      mbar_init(&s.do_empty[i], kConsumerThreads);
    }
    for (int w = 0; w < 2; ++w) {
      mbar_init(&s.dq_full[w], 128);
      mbar_init(&s.dq_empty[w], 1);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    // 128 x 24 + 256 x 240 = 384 x 168, the registers the launch gave the CTA: asking for more
    // would make the consumers' setmaxnreg.inc wait forever.
    regs_dealloc<24>();
    if (threadIdx.x == 0) {
      tma_prefetch_descriptor(&tm_q);
      tma_prefetch_descriptor(&tm_do);
      mbar_arrive_expect_tx(&s.kv_full, 2 * kBN * D * sizeof(E));
#pragma unroll
      for (int cb = 0; cb < kCB; ++cb) {
        tma_load_4d(&s.k[cb][0][0], &tm_k, &s.kv_full, cb * 64, n0, h, b);
        tma_load_4d(&s.v[cb][0][0], &tm_v, &s.kv_full, cb * 64, n0, h, b);
      }
      for (int i = 0; i < steps; ++i) {
        const int m = m_begin + i, st = i % kStages;
        const unsigned phase = (i / kStages) & 1;
        mbar_wait(&s.q_empty[st], phase ^ 1);
        const long long row = static_cast<long long>(bh) * seq_pad + m * kBM;
        mbar_arrive_expect_tx(&s.q_full[st], kQBytes + kBM * sizeof(float));
#pragma unroll
        for (int cb = 0; cb < kCB; ++cb) tma_load_4d(&s.q[st][cb][0][0], &tm_q, &s.q_full[st], cb * 64, m * kBM, h, b);
        bulk_load(&s.lse2[st][0], p.lse_log2 + row, kBM * sizeof(float), &s.q_full[st]);
        mbar_wait(&s.do_empty[st], phase ^ 1);
        mbar_arrive_expect_tx(&s.do_full[st], kQBytes + kBM * sizeof(float));
#pragma unroll
        for (int cb = 0; cb < kCB; ++cb)
          tma_load_4d(&s.dout[st][cb][0][0], &tm_do, &s.do_full[st], cb * 64, m * kBM, h, b);
        bulk_load(&s.dsum[st][0], p.dsum + row, kBM * sizeof(float), &s.do_full[st]);
      }
    } else if (threadIdx.x == 32) {
      // dQ writer: each consumer warpgroup's staged half-tile goes to the accumulator by a bulk
      // reduction; the stage is handed back once the copy engine has read it.
      const int m_tiles = m_end;
      for (int i = 0; i < steps; ++i)
        for (int w = 0; w < 2; ++w) {
          mbar_wait(&s.dq_full[w], i & 1);
          bulk_reduce_add_f32(p.dq_accum + dq_block_offset(bh, m_tiles, m_begin + i, w, D), s.dq[w],
                              kBM * D / 2 * sizeof(float));
          bulk_wait_read();
          mbar_arrive(&s.dq_empty[w]);
        }
    }
    return;
  }

  regs_alloc<240>();
  const int tid = static_cast<int>(threadIdx.x) - 128 * wg;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int kw = (wg - 1) * 64;                  // this warpgroup's keys within the CTA tile
  const int key0 = n0 + kw + 16 * warp + g;      // this thread's keys: key0, key0 + 8
  const float sl2 = p.scale * kLog2e;
  constexpr int kHalf = D / 2;                   // dQ columns per warpgroup
  const int dq_col0 = (wg - 1) * kHalf;

  float dv[D / 2], dk[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dv[i] = dk[i] = 0.f;
  float sacc[kBM / 2], dpacc[kBM / 2], dqacc[kHalf / 2];
  std::uint32_t pf[kBM / 16][4];

  mbar_wait(&s.kv_full, 0);
  for (int i = 0; i < steps; ++i) {
    const int m0 = (m_begin + i) * kBM, st = i % kStages, buf = i & 1;
    const unsigned phase = (i / kStages) & 1;
    // S^T and dP^T, both over the head dim (K-major operands).
    mbar_wait(&s.q_full[st], phase);
    wgmma_fence();
    fence_regs(sacc);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int cb = kk / 4, kin = kk % 4;
      wgmma_ss<kBM, kF16, 0, 0>(sacc, desc_k_major(smem_u32(&s.k[cb][kw][0]) + kin * 32),
                                desc_k_major(smem_u32(&s.q[st][cb][0][0]) + kin * 32), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    mbar_wait(&s.do_full[st], phase);
    fence_regs(dpacc);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int cb = kk / 4, kin = kk % 4;
      wgmma_ss<kBM, kF16, 0, 0>(dpacc, desc_k_major(smem_u32(&s.v[cb][kw][0]) + kin * 32),
                                desc_k_major(smem_u32(&s.dout[st][cb][0][0]) + kin * 32), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<1>();
    fence_regs(sacc);
    // P^T = exp2(S^T * scale * log2e - lse2): rows are keys (key0, key0 + 8), columns queries.
    // Queries past the end need no mask: their Q and dO rows are zeros (TMA fill) and their lse2
    // and D are zeros, so P = 1 there but dP = 0, dS = 0 and P^T dO = 0.
    const bool masked = kCausal && n0 + kw + 63 > m0;
    // This thread's query columns 2t (+1) of lse2 and D, as 32-bit shared addresses.
    const std::uint32_t lse2_t = smem_u32(&s.lse2[st][0]) + 8 * t, dsum_t = smem_u32(&s.dsum[st][0]) + 8 * t;
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = e & 1, q = m0 + 8 * j + 2 * t + c, key = key0 + (e >= 2 ? 8 : 0);
        float x = fast_exp2(fmaf(sacc[4 * j + e], sl2, -ld_shared_f32(lse2_t + 4 * (8 * j + c))));
        if (masked && key > q) x = 0.f;
        sacc[4 * j + e] = x;
      }
    // dV += P^T dO (dO N-major: 16 query rows of the tile per k-step); it runs beside dS.
    pack_fragments<E>(sacc, pf);
    wgmma_fence();
    fence_regs(dv);
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
      wgmma_rs<D, kF16, 1>(dv, pf[kk], desc_mn_major(smem_u32(&s.dout[st][0][0][0]) + kk * 2048, kBM * 128), 1);
    wgmma_commit();
    wgmma_wait<1>();   // dP^T
    fence_regs(dpacc);
    // dS^T = P^T (dP^T - D), rounded to E: the A fragments of dK (registers: wgmma's accumulator
    // layout is its A-fragment layout) and, through shared memory, dQ's A operand for both halves
    // of the CTA's keys: rows key (kw + 16 warp + g, +8), columns query 16kk + 2t (+8).
    std::uint32_t dsf[kBM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
#pragma unroll
      for (int x = 0; x < 8; ++x) {
        const int col = 16 * kk + 8 * (x >> 2) + (x & 1);   // this thread's query column, less 2t
        dpacc[8 * kk + x] = sacc[8 * kk + x] * (dpacc[8 * kk + x] - ld_shared_f32(dsum_t + 4 * col));
      }
    pack_fragments<E>(dpacc, dsf);
    // dK += dS^T Q: A = dS^T from registers, B = Q (N-major). It needs no other warpgroup's keys,
    // so it is issued before the barrier.
    wgmma_fence();
    fence_regs(dk);
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
      wgmma_rs<D, kF16, 1>(dk, dsf[kk], desc_mn_major(smem_u32(&s.q[st][0][0][0]) + kk * 2048, kBM * 128), 1);
    wgmma_commit();
    store_fragment_tile(smem_u32(&s.ds[buf][0][0]), kw + 16 * warp + g, g, t, dsf);
    fence_proxy_async_smem();
    named_sync(kDsBarrier, kConsumerThreads);
    // dQ_w = dS K[:, dq_col0 .. + D/2): A = the whole dS^T tile read M-major (queries contiguous),
    // B = K read N-major (the column half of the K tile: a column block at D = 128, 64 bytes into
    // the swizzle atom at D = 64), K dimension = the CTA's 128 keys.
    fence_regs(dqacc);
    {
      const std::uint32_t k_base = smem_u32(&s.k[dq_col0 / 64][0][0]) + (dq_col0 % 64) * 2;
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk)
        wgmma_ss<kHalf, kF16, 1, 1>(dqacc, desc_mn_major(smem_u32(&s.ds[buf][0][0]) + kk * 2048, kBN * 128),
                                    desc_mn_major(k_base + kk * 2048, kBN * 128), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(dv);
    fence_regs(dk);
    fence_regs(dqacc);
    mbar_arrive(&s.q_empty[st]);
    mbar_arrive(&s.do_empty[st]);
    // The writer has read this warpgroup's previous dQ stage. The __syncwarp after the spin wait
    // tells ptxas the warp has converged again: without it ptxas took the code after the wait for
    // a divergent path, inserted a warpgroup arrive there and serialised every wgmma of the kernel
    // (C7520: one wait after each of the 32 wgmmas). Waiting at the top of the iteration instead
    // also avoids that, but stalls the next tile's S^T on the writer's read.
    mbar_wait(&s.dq_empty[wg - 1], (i & 1) ^ 1);
    __syncwarp();
    // Stage this warpgroup's dQ half for the writer (float4 j of thread tid at (j * 128 + tid) * 4).
    {
      const std::uint32_t stage = smem_u32(s.dq[wg - 1]) + 16 * tid;
#pragma unroll
      for (int j = 0; j < kHalf / 8; ++j)
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(stage + j * 128 * 16), "f"(dqacc[4 * j]),
                     "f"(dqacc[4 * j + 1]), "f"(dqacc[4 * j + 2]), "f"(dqacc[4 * j + 3])
                     : "memory");
    }
    fence_proxy_async_smem();
    mbar_arrive(&s.dq_full[wg - 1]);
  }

  // Epilogue: dV and scale * dK in the input dtype, rows key0 and key0 + 8.
  const long long head = static_cast<long long>(b) * p.stride_b + static_cast<long long>(h) * p.stride_h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + 8 * r;
    if (key >= p.seq) continue;
    E* dvp = static_cast<E*>(p.dv) + head + static_cast<long long>(key) * p.stride_t + 2 * t;
    E* dkp = static_cast<E*>(p.dk) + head + static_cast<long long>(key) * p.stride_t + 2 * t;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      *reinterpret_cast<std::uint32_t*>(dvp + 8 * j) = pack2<E>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
      *reinterpret_cast<std::uint32_t*>(dkp + 8 * j) =
          pack2<E>(dk[4 * j + 2 * r] * p.scale, dk[4 * j + 2 * r + 1] * p.scale);
    }
  }
#endif
}

// dQ = scale * dQacc from the blocked accumulator. Rows r and r + 8 of a 16-row group share a
// consumer thread, so their (c, c + 1) values are one float4: one thread per (row pair, column
// pair), a warp writes whole rows (one thread per single row and column pair took 12 us per xl layer).
template <class E, int D>
__global__ void flash_bwd_sm90_dq_convert_kernel(const Params p) {
  constexpr int kPairs = D / 2;
  const int m_tiles = (p.seq + kBM - 1) / kBM;
  const int groups = m_tiles * (kBM / 16);   // 16-row groups of a (batch, head) over the padded rows
  const long long items = static_cast<long long>(p.batch) * p.heads * groups * 8 * kPairs;
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= items) return;
  const int col = static_cast<int>(idx % kPairs) * 2;
  long long rest = idx / kPairs;
  const int r8 = static_cast<int>(rest % 8);
  rest /= 8;
  const int q = static_cast<int>(rest % groups) * 16 + r8;   // rows q and q + 8
  const long long bh = rest / groups;
  if (q >= p.seq) return;
  const int half = col / (D / 2), c = col % (D / 2), r = q % kBM;
  const int tid = (r / 16) * 32 + (r % 8) * 4 + (c % 8) / 2;
  const long long off = dq_block_offset(bh, m_tiles, q / kBM, half, D) + ((c / 8) * 128 + tid) * 4;
  const float4 x = *reinterpret_cast<const float4*>(p.dq_accum + off);   // (q: c, c+1), (q+8: c, c+1)
  const long long b = bh / p.heads, h = bh % p.heads;
  E* out = static_cast<E*>(p.dq) + b * p.stride_b + h * p.stride_h + static_cast<long long>(q) * p.stride_t + col;
  *reinterpret_cast<std::uint32_t*>(out) = pack2<E>(x.x * p.scale, x.y * p.scale);
  if (q + 8 < p.seq) *reinterpret_cast<std::uint32_t*>(out + 8 * p.stride_t) = pack2<E>(x.z * p.scale, x.w * p.scale);
}

template <class E, int D, bool kCausal>
void launch(const Params& p, const TmaMaps& maps, cudaStream_t stream) {
  auto kernel = flash_bwd_sm90_kernel<E, D, kCausal>;
  constexpr std::size_t smem = smem_bytes<E, D>();
  static const bool attr_ok = [&] {
    LMSCALE_ATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    return true;
  }();
  (void)attr_ok;
  const dim3 grid(static_cast<unsigned>((p.seq + kBN - 1) / kBN), static_cast<unsigned>(p.batch * p.heads));
  kernel<<<grid, kThreads, smem, stream>>>(maps.q, maps.k, maps.v, maps.dout, p);
  LMSCALE_ATTN_CHECK_LAUNCH();
  const long long items = static_cast<long long>(p.batch) * p.heads * ((p.seq + kBM - 1) / kBM) * (kBM / 2) * (D / 2);
  constexpr int kConvertThreads = 256;
  flash_bwd_sm90_dq_convert_kernel<E, D>
      <<<static_cast<unsigned>((items + kConvertThreads - 1) / kConvertThreads), kConvertThreads, 0, stream>>>(p);
  LMSCALE_ATTN_CHECK_LAUNCH();
}

template <class E>
void launch_dim(const Params& p, const TmaMaps& maps, cudaStream_t stream) {
  if (p.head_dim == 64) return p.causal ? launch<E, 64, true>(p, maps, stream) : launch<E, 64, false>(p, maps, stream);
  if (p.head_dim == 128) return p.causal ? launch<E, 128, true>(p, maps, stream) : launch<E, 128, false>(p, maps, stream);
  throw_error("flash attention backward (sm90): head_dim 64 or 128 only");
}

}  // namespace lmscale::ops::cuda::attn::sm90_bwd

namespace lmscale::ops::cuda::attn {

int sm90_bwd_seq_pad(int seq) { return (seq + sm90_bwd::kBM - 1) / sm90_bwd::kBM * sm90_bwd::kBM; }

void launch_flash_bwd_sm90(const Params& p, Elem e, const TmaMaps& maps, cudaStream_t stream) {
  if (p.dq_accum == nullptr || p.dsum == nullptr || p.lse_log2 == nullptr)
    throw_error("flash attention backward (sm90): no dQ accumulator or padded lse/D workspace");
  const int seq_pad = sm90_bwd_seq_pad(p.seq);
  // The prep kernel's 16-byte loads of O and dO (dO's TMA map already asks the same of dO).
  if ((reinterpret_cast<std::uintptr_t>(p.o) | reinterpret_cast<std::uintptr_t>(p.dout)) % 16 != 0 ||
      (p.o_stride_b | p.o_stride_h | p.o_stride_t) % 8 != 0)
    throw_error("flash attention backward (sm90): O and dO must be 16-byte aligned with strides of 8 elements");
  {
    const long long threads = static_cast<long long>(p.batch) * p.heads * seq_pad * (p.head_dim / 8);
    constexpr int kPrepThreads = 256;
    const unsigned blocks = static_cast<unsigned>((threads + kPrepThreads - 1) / kPrepThreads);
    auto prep = [&](auto elem) {
      using E = decltype(elem);
      if (p.head_dim == 64) sm90_bwd::flash_bwd_sm90_prep_kernel<E, 64><<<blocks, kPrepThreads, 0, stream>>>(p, seq_pad);
      else if (p.head_dim == 128)
        sm90_bwd::flash_bwd_sm90_prep_kernel<E, 128><<<blocks, kPrepThreads, 0, stream>>>(p, seq_pad);
      else
        throw_error("flash attention backward (sm90): head_dim 64 or 128 only");
    };
    if (e == Elem::bf16) prep(__nv_bfloat16{});
    else prep(__half{});
    LMSCALE_ATTN_CHECK_LAUNCH();
  }
  if (e == Elem::bf16)
    sm90_bwd::launch_dim<__nv_bfloat16>(p, maps, stream);
  else if (e == Elem::f16)
    sm90_bwd::launch_dim<__half>(p, maps, stream);
  else
    throw_error("flash attention backward (sm90): bf16 or fp16 only");
}

}  // namespace lmscale::ops::cuda::attn
