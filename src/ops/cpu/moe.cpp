// Mixture-of-experts routing on the CPU (lmscale/ops/moe.h): router softmax and top-k, the
// dispatch plan with capacity, the permutation into expert order and back, the router losses and
// the router's backward. Loops over rows; the experts' GEMMs are ops::linear on the permuted rows.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dtype_dispatch.h"
#include "moe_cpu.h"

namespace lmscale::ops::cpu {

void moe_route(Context&, const Tensor& logits, Tensor& probs, Tensor& lse, Tensor& experts, Tensor& gates) {
  const std::int64_t N = logits.dim(0), E = logits.dim(1), k = experts.dim(1);
  dispatch_real("ops::moe_route", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* z = logits.data_as<T>();
    T* p = probs.data_as<T>();
    T* l = lse.data_as<T>();
    T* g = gates.data_as<T>();
    std::int32_t* ex = experts.data_as<std::int32_t>();
    std::vector<char> taken(static_cast<std::size_t>(E));
    for (std::int64_t n = 0; n < N; ++n) {
      const T* zr = z + n * E;
      T* pr = p + n * E;
      double m = -std::numeric_limits<double>::infinity();
      for (std::int64_t e = 0; e < E; ++e) m = std::max(m, static_cast<double>(zr[e]));
      double s = 0;
      for (std::int64_t e = 0; e < E; ++e) s += std::exp(static_cast<double>(zr[e]) - m);
      l[n] = static_cast<T>(m + std::log(s));
      for (std::int64_t e = 0; e < E; ++e) pr[e] = static_cast<T>(std::exp(static_cast<double>(zr[e]) - m) / s);
      // Top-k by repeated selection: the largest probability not yet taken; a strictly larger one
      // replaces the candidate, so of equal probabilities the lower expert index wins.
      std::fill(taken.begin(), taken.end(), 0);
      double sum = 0;
      for (std::int64_t j = 0; j < k; ++j) {
        std::int64_t best = -1;
        for (std::int64_t e = 0; e < E; ++e)
          if (!taken[static_cast<std::size_t>(e)] && (best < 0 || pr[e] > pr[best])) best = e;
        taken[static_cast<std::size_t>(best)] = 1;
        ex[n * k + j] = static_cast<std::int32_t>(best);
        sum += static_cast<double>(pr[best]);
      }
      for (std::int64_t j = 0; j < k; ++j) g[n * k + j] = static_cast<T>(static_cast<double>(pr[ex[n * k + j]]) / sum);
    }
  });
}

void moe_plan(Context&, const Tensor& experts, std::int64_t group, std::int64_t capacity, Tensor& slot, Tensor& kept,
              Tensor& routed) {
  const std::int64_t N = experts.dim(0), k = experts.dim(1), E = kept.numel();
  const std::int32_t* ex = experts.data_as<std::int32_t>();
  std::int32_t* sl = slot.data_as<std::int32_t>();
  std::int32_t* kp = kept.data_as<std::int32_t>();
  std::int32_t* rt = routed.data_as<std::int32_t>();
  // Pass 1: each assignment's place in its expert's queue of its group, in (token, j) order; an
  // assignment past the capacity is dropped (-1), a kept one gets its rank among the expert's
  // kept assignments of the whole micro-batch.
  std::vector<std::int64_t> in_group(static_cast<std::size_t>(E)), kept_so_far(static_cast<std::size_t>(E), 0);
  std::vector<std::int64_t> routed_count(static_cast<std::size_t>(E), 0);
  for (std::int64_t n0 = 0; n0 < N; n0 += group) {
    std::fill(in_group.begin(), in_group.end(), 0);
    for (std::int64_t i = n0 * k; i < (n0 + group) * k; ++i) {
      const std::int32_t e = ex[i];
      LMSCALE_CHECK(e >= 0 && e < E, "ops::moe_plan: expert index {} at assignment {} outside [0, {})", e, i, E);
      const auto u = static_cast<std::size_t>(e);
      ++routed_count[u];
      sl[i] = in_group[u]++ < capacity ? static_cast<std::int32_t>(kept_so_far[u]++) : -1;
    }
  }
  // Pass 2: expert e's rows start after the kept rows of the experts before it.
  std::vector<std::int64_t> start(static_cast<std::size_t>(E), 0);
  std::int64_t off = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    const auto u = static_cast<std::size_t>(e);
    rt[e] = static_cast<std::int32_t>(routed_count[u]);
    kp[e] = static_cast<std::int32_t>(kept_so_far[u]);
    start[u] = off;
    off += kept_so_far[u];
  }
  for (std::int64_t i = 0; i < N * k; ++i)
    if (sl[i] >= 0) sl[i] = static_cast<std::int32_t>(start[static_cast<std::size_t>(ex[i])] + sl[i]);
}

void moe_gather(Context&, const Tensor& x, const Tensor& slot, Tensor& xe) {
  const std::int64_t N = x.dim(0), d = x.dim(1), k = slot.dim(1), M = xe.dim(0);
  const std::int32_t* sl = slot.data_as<std::int32_t>();
  const std::size_t row = static_cast<std::size_t>(d) * dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.data());
  char* dst = static_cast<char*>(xe.data());
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t s = sl[n * k + j];
      if (s < 0) continue;
      LMSCALE_CHECK(s < M, "ops::moe_gather: slot {} outside the {} expert rows", s, M);
      std::memcpy(dst + static_cast<std::size_t>(s) * row, src + static_cast<std::size_t>(n) * row, row);
    }
}

void moe_gather_backward(Context&, const Tensor& dxe, const Tensor& slot, Tensor& dx, bool accumulate) {
  const std::int64_t N = dx.dim(0), d = dx.dim(1), k = slot.dim(1), M = dxe.dim(0);
  dispatch_real("ops::moe_gather_backward", dx.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int32_t* sl = slot.data_as<std::int32_t>();
    const T* src = dxe.data_as<T>();
    T* out = dx.data_as<T>();
    for (std::int64_t n = 0; n < N; ++n) {
      T* o = out + n * d;
      if (!accumulate) std::fill(o, o + d, T(0));
      for (std::int64_t j = 0; j < k; ++j) {   // in j order: the sum's order is fixed
        const std::int32_t s = sl[n * k + j];
        if (s < 0) continue;
        LMSCALE_CHECK(s < M, "ops::moe_gather_backward: slot {} outside the {} expert rows", s, M);
        const T* r = src + static_cast<std::int64_t>(s) * d;
        for (std::int64_t c = 0; c < d; ++c) o[c] += r[c];
      }
    }
  });
}

void moe_combine(Context&, const Tensor& ye, const Tensor& slot, const Tensor& gates, Tensor& out) {
  const std::int64_t N = out.dim(0), d = out.dim(1), k = slot.dim(1), M = ye.dim(0);
  dispatch_real("ops::moe_combine", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int32_t* sl = slot.data_as<std::int32_t>();
    const T* y = ye.data_as<T>();
    const T* g = gates.data_as<T>();
    T* o = out.data_as<T>();
    for (std::int64_t n = 0; n < N; ++n) {
      T* orow = o + n * d;
      std::fill(orow, orow + d, T(0));
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int32_t s = sl[n * k + j];
        if (s < 0) continue;
        LMSCALE_CHECK(s < M, "ops::moe_combine: slot {} outside the {} expert rows", s, M);
        const T gv = g[n * k + j];
        const T* r = y + static_cast<std::int64_t>(s) * d;
        for (std::int64_t c = 0; c < d; ++c) orow[c] += gv * r[c];
      }
    }
  });
}

void moe_combine_backward(Context&, const Tensor& dout, const Tensor& ye, const Tensor& slot, const Tensor& gates,
                          Tensor& dye, Tensor& dgates) {
  const std::int64_t N = dout.dim(0), d = dout.dim(1), k = slot.dim(1), M = ye.dim(0);
  dispatch_real("ops::moe_combine_backward", dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int32_t* sl = slot.data_as<std::int32_t>();
    const T* dy = dout.data_as<T>();
    const T* y = ye.data_as<T>();
    const T* g = gates.data_as<T>();
    T* dyo = dye.data_as<T>();
    T* dg = dgates.data_as<T>();
    for (std::int64_t n = 0; n < N; ++n) {
      const T* drow = dy + n * d;
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int32_t s = sl[n * k + j];
        if (s < 0) {
          dg[n * k + j] = T(0);
          continue;
        }
        LMSCALE_CHECK(s < M, "ops::moe_combine_backward: slot {} outside the {} expert rows", s, M);
        const T gv = g[n * k + j];
        const T* yr = y + static_cast<std::int64_t>(s) * d;
        T* dyr = dyo + static_cast<std::int64_t>(s) * d;
        double dot = 0;
        for (std::int64_t c = 0; c < d; ++c) {
          dot += static_cast<double>(drow[c]) * static_cast<double>(yr[c]);
          dyr[c] = gv * drow[c];
        }
        dg[n * k + j] = static_cast<T>(dot);
      }
    }
  });
}

namespace {

// c_e of the sequence starting at row n0: assignments to each expert over its T rows.
void sequence_counts(const std::int32_t* ex, std::int64_t n0, std::int64_t T, std::int64_t k, std::vector<double>& c) {
  std::fill(c.begin(), c.end(), 0.0);
  for (std::int64_t i = n0 * k; i < (n0 + T) * k; ++i) c[static_cast<std::size_t>(ex[i])] += 1.0;
}

}  // namespace

void moe_router_losses(Context&, const Tensor& probs, const Tensor& lse, const Tensor& experts, std::int64_t T,
                       double aux_coef, double z_coef, Tensor& terms) {
  const std::int64_t N = probs.dim(0), E = probs.dim(1), k = experts.dim(1);
  dispatch_real("ops::moe_router_losses", probs.dtype(), [&](auto tag) {
    using V = decltype(tag);
    const V* p = probs.data_as<V>();
    const V* l = lse.data_as<V>();
    const std::int32_t* ex = experts.data_as<std::int32_t>();
    std::vector<double> c(static_cast<std::size_t>(E)), P(static_cast<std::size_t>(E));
    double balance = 0, z = 0;
    for (std::int64_t n0 = 0; n0 < N; n0 += T) {
      sequence_counts(ex, n0, T, k, c);
      std::fill(P.begin(), P.end(), 0.0);
      for (std::int64_t n = n0; n < n0 + T; ++n)
        for (std::int64_t e = 0; e < E; ++e) P[static_cast<std::size_t>(e)] += static_cast<double>(p[n * E + e]);
      double s = 0;
      for (std::int64_t e = 0; e < E; ++e) s += P[static_cast<std::size_t>(e)] * c[static_cast<std::size_t>(e)];
      balance += static_cast<double>(E) / static_cast<double>(T * k) * s;
    }
    for (std::int64_t n = 0; n < N; ++n) z += static_cast<double>(l[n]) * static_cast<double>(l[n]);
    V* t = terms.data_as<V>();
    t[0] = static_cast<V>(balance);
    t[1] = static_cast<V>(z);
    t[2] = static_cast<V>(aux_coef * balance + z_coef * z);
  });
}

void moe_route_backward(Context&, const Tensor& probs, const Tensor& lse, const Tensor& experts, const Tensor& gates,
                        const Tensor& dgates, std::int64_t T, double aux_coef, double z_coef, double scale,
                        Tensor& dlogits) {
  const std::int64_t N = probs.dim(0), E = probs.dim(1), k = experts.dim(1);
  // One dtype for the statistics and the logits' gradient (bf16/fp16 mixed precision is CUDA only).
  dispatch_real("ops::moe_route_backward", dlogits.dtype(), [](auto) {});
  dispatch_real("ops::moe_route_backward", probs.dtype(), [&](auto tag) {
    using V = decltype(tag);
    const V* p = probs.data_as<V>();
    const V* l = lse.data_as<V>();
    const V* g = gates.data_as<V>();
    const V* dg = dgates.data_as<V>();
    const std::int32_t* ex = experts.data_as<std::int32_t>();
    V* dz = dlogits.data_as<V>();
    std::vector<double> c(static_cast<std::size_t>(E)), dp(static_cast<std::size_t>(E));
    const double balance = scale * aux_coef * static_cast<double>(E) / static_cast<double>(T * k);
    for (std::int64_t n0 = 0; n0 < N; n0 += T) {
      sequence_counts(ex, n0, T, k, c);
      for (std::int64_t n = n0; n < n0 + T; ++n) {
        const V* pr = p + n * E;
        for (std::int64_t e = 0; e < E; ++e) dp[static_cast<std::size_t>(e)] = balance * c[static_cast<std::size_t>(e)];
        // Gates g_j = p_{e_j} / S with S the sum of the k chosen probabilities.
        double S = 0, dot = 0;
        for (std::int64_t j = 0; j < k; ++j) {
          S += static_cast<double>(pr[ex[n * k + j]]);
          dot += static_cast<double>(dg[n * k + j]) * static_cast<double>(g[n * k + j]);
        }
        for (std::int64_t j = 0; j < k; ++j)
          dp[static_cast<std::size_t>(ex[n * k + j])] += (static_cast<double>(dg[n * k + j]) - dot) / S;
        double pdp = 0;
        for (std::int64_t e = 0; e < E; ++e) pdp += static_cast<double>(pr[e]) * dp[static_cast<std::size_t>(e)];
        const double zterm = scale * z_coef * 2.0 * static_cast<double>(l[n]);
        for (std::int64_t e = 0; e < E; ++e) {
          const double pe = static_cast<double>(pr[e]);
          dz[n * E + e] = static_cast<V>(pe * (dp[static_cast<std::size_t>(e)] - pdp) + zterm * pe);
        }
      }
    }
  });
}

}  // namespace lmscale::ops::cpu
