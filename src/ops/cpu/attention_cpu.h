#pragma once
// CPU attention kernels (float and double) behind ops::attention_* (src/ops/attention.cpp).
// Q, K, V, O, dO, dQ, dK, dV share the strided layout of ops::AttentionShape: element (b,h,t,e)
// at b*stride_b + h*stride_h + t*stride_t + e. probs is [B,H,T,T] and lse is [B,H,T], both
// contiguous and in the element type T. The tile matrix products go through OpenBLAS (cblas).
#include <cstdint>

#include "lmscale/ops/ops.h"

namespace lmscale::ops::cpu {

// Naive attention: S = scale*Q K^T materialised, softmax per row (causal: keys after the query get
// probability 0), O = P V. probs keeps P for the backward.
template <class T>
void attention_naive_forward(const AttentionShape& s, const T* q, const T* k, const T* v, T* o, T* probs);
// dV = P^T dO; dP = dO V^T; dS = P*(dP - rowsum(P*dP)); dQ = scale dS K; dK = scale dS^T Q.
template <class T>
void attention_naive_backward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* probs,
                              const T* dout, T* dq, T* dk, T* dv);

// Tile sizes of the CPU FlashAttention-2 (query tile Br x key tile Bc), each >= 16.
struct FlashTiles {
  std::int64_t q_tile = 64;   // B_r
  std::int64_t k_tile = 64;   // B_c
};

// FlashAttention-2 forward (Algorithm 1): for each query tile, stream over key tiles keeping the
// running row max m, running sum l and unnormalised output; O = acc / l, lse = m + log(l).
// Causal: key tiles wholly above the diagonal are skipped, the diagonal tile is masked.
template <class T>
void attention_flash_forward(const AttentionShape& s, const T* q, const T* k, const T* v, T* o, T* lse,
                             FlashTiles tiles = {});
// FlashAttention-2 backward (Algorithm 2, eqs. 13-19): D = rowsum(dO*O); outer loop over key tiles
// (dK_j, dV_j accumulated per tile), inner loop over query tiles recomputing P = exp(S - lse);
// dQ_i accumulated across key tiles. dq, dk, dv are overwritten.
template <class T>
void attention_flash_backward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* o,
                              const T* lse, const T* dout, T* dq, T* dk, T* dv, FlashTiles tiles = {});

}  // namespace lmscale::ops::cpu
