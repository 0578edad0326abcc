// Naive attention on the CPU: the full score matrix per head is materialised (probs [B,H,T,T]).
// Softmax statistics are kept in double for both element types.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "attention_blas.h"
#include "attention_cpu.h"
#include "lmscale/core/nvtx.h"

namespace lmscale::ops::cpu {

using attention_detail::gemm;
using attention_detail::head_offset;
using attention_detail::o_head_offset;

template <class T>
void attention_naive_forward(const AttentionShape& s, const T* q, const T* k, const T* v, T* o, T* probs) {
  const std::int64_t Tn = s.seq, D = s.head_dim, ld = s.stride_t, ldo = s.o_stride_t;
  const T scale = static_cast<T>(s.softmax_scale());
  // Three passes over the heads rather than one: each stage is one range (scores, softmax,
  // weighted_sum) in profiles and run.trace, as on CUDA; every head's arithmetic is unchanged.
  auto each_head = [&](auto&& f) {
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads; ++h)
        f(head_offset(s, b, h), o_head_offset(s, b, h), probs + (b * s.heads + h) * Tn * Tn);
  };
  std::optional<NvtxRange> range(std::in_place, "scores");
  // S = scale * Q K^T  -> P [T, T] (overwritten by the softmax below)
  each_head([&](std::int64_t off, std::int64_t, T* P) { gemm(false, true, Tn, Tn, D, scale, q + off, ld, k + off, ld, T(0), P, Tn); });
  range.emplace("softmax");
  each_head([&](std::int64_t, std::int64_t, T* P) {
    for (std::int64_t i = 0; i < Tn; ++i) {
      T* row = P + i * Tn;
      const std::int64_t valid = s.causal ? i + 1 : Tn;   // keys 0..valid-1 take part
      double mx = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j < valid; ++j) mx = std::max(mx, static_cast<double>(row[j]));
      double sum = 0;
      for (std::int64_t j = 0; j < valid; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
      for (std::int64_t j = 0; j < valid; ++j) row[j] = static_cast<T>(std::exp(static_cast<double>(row[j]) - mx) / sum);
      for (std::int64_t j = valid; j < Tn; ++j) row[j] = T(0);
    }
  });
  range.emplace("weighted_sum");
  // O = P V
  each_head([&](std::int64_t off, std::int64_t ooff, T* P) {
    gemm(false, false, Tn, D, Tn, T(1), P, Tn, v + off, ld, T(0), o + ooff, ldo);
  });
}

template <class T>
void attention_naive_backward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* probs,
                              const T* dout, T* dq, T* dk, T* dv) {
  const std::int64_t Tn = s.seq, D = s.head_dim, ld = s.stride_t, ldo = s.o_stride_t;
  const T scale = static_cast<T>(s.softmax_scale());
  std::vector<T> dS(static_cast<std::size_t>(Tn * Tn));   // dP, then dS in place  [T, T]
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const std::int64_t off = head_offset(s, b, h), ooff = o_head_offset(s, b, h);
      const T* P = probs + (b * s.heads + h) * Tn * Tn;
      // dV = P^T dO
      gemm(true, false, Tn, D, Tn, T(1), P, Tn, dout + ooff, ldo, T(0), dv + off, ld);
      // dP = dO V^T
      gemm(false, true, Tn, Tn, D, T(1), dout + ooff, ldo, v + off, ld, T(0), dS.data(), Tn);
      // dS = P * (dP - rowsum(P * dP))   (the softmax Jacobian-vector product)
      for (std::int64_t i = 0; i < Tn; ++i) {
        const T* p = P + i * Tn;
        T* d = dS.data() + i * Tn;
        double dot = 0;
        for (std::int64_t j = 0; j < Tn; ++j) dot += static_cast<double>(p[j]) * static_cast<double>(d[j]);
        for (std::int64_t j = 0; j < Tn; ++j) d[j] = static_cast<T>(static_cast<double>(p[j]) * (static_cast<double>(d[j]) - dot));
      }
      // dQ = scale dS K ; dK = scale dS^T Q
      gemm(false, false, Tn, D, Tn, scale, dS.data(), Tn, k + off, ld, T(0), dq + off, ld);
      gemm(true, false, Tn, D, Tn, scale, dS.data(), Tn, q + off, ld, T(0), dk + off, ld);
    }
  }
}

template void attention_naive_forward<float>(const AttentionShape&, const float*, const float*, const float*, float*,
                                             float*);
template void attention_naive_forward<double>(const AttentionShape&, const double*, const double*, const double*,
                                              double*, double*);
template void attention_naive_backward<float>(const AttentionShape&, const float*, const float*, const float*,
                                              const float*, const float*, float*, float*, float*);
template void attention_naive_backward<double>(const AttentionShape&, const double*, const double*, const double*,
                                               const double*, const double*, double*, double*, double*);

}  // namespace lmscale::ops::cpu
