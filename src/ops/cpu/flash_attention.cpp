// FlashAttention-2 on the CPU (float, double): the tiled algorithm of Dao (2023), Algorithms 1
// and 2, with OpenBLAS for the tile products. It is the reference the CUDA kernels are tested
// against beside the naive version, and the CPU path of model.attention = flash.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_blas.h"
#include "attention_cpu.h"
#include "lmscale/core/error.h"

namespace lmscale::ops::cpu {

using attention_detail::gemm;
using attention_detail::head_offset;
using attention_detail::o_head_offset;

namespace {

void check_tiles(const FlashTiles& t) {
  LMSCALE_CHECK(t.q_tile >= 16 && t.k_tile >= 16, "flash attention tiles must be >= 16 (got {} x {})", t.q_tile,
                t.k_tile);
}

// Sets rows [r0, r1) of one head to zero.
template <class T>
void zero_rows(T* base, std::int64_t r0, std::int64_t r1, std::int64_t ld, std::int64_t D) {
  for (std::int64_t r = r0; r < r1; ++r) std::fill(base + r * ld, base + r * ld + D, T(0));
}

}  // namespace

template <class T>
void attention_flash_forward(const AttentionShape& s, const T* q, const T* k, const T* v, T* o, T* lse,
                             FlashTiles tiles) {
  check_tiles(tiles);
  const std::int64_t Tn = s.seq, D = s.head_dim, ld = s.stride_t, ldo = s.o_stride_t, Br = tiles.q_tile,
                     Bc = tiles.k_tile;
  const T scale = static_cast<T>(s.softmax_scale());
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> S(static_cast<std::size_t>(Br * Bc));     // scores, then P  [Br, Bc]
  std::vector<T> acc(static_cast<std::size_t>(Br * D));    // unnormalised O  [Br, D]
  std::vector<T> m(static_cast<std::size_t>(Br)), l(static_cast<std::size_t>(Br));
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const std::int64_t off = head_offset(s, b, h);
      const T *Q = q + off, *K = k + off, *V = v + off;
      T* O = o + o_head_offset(s, b, h);
      T* L = lse + (b * s.heads + h) * Tn;
      for (std::int64_t i0 = 0; i0 < Tn; i0 += Br) {
        const std::int64_t i1 = std::min(i0 + Br, Tn), nr = i1 - i0;
        std::fill(m.begin(), m.end(), neg_inf);
        std::fill(l.begin(), l.end(), T(0));
        std::fill(acc.begin(), acc.end(), T(0));
        for (std::int64_t j0 = 0; j0 < Tn; j0 += Bc) {
          if (s.causal && j0 > i1 - 1) break;   // this and later key tiles lie above the diagonal
          const std::int64_t j1 = std::min(j0 + Bc, Tn), nc = j1 - j0;
          // S = scale * Q_i K_j^T   [nr, nc], leading dimension Bc
          gemm(false, true, nr, nc, D, scale, Q + i0 * ld, ld, K + j0 * ld, ld, T(0), S.data(), Bc);
          const bool on_diagonal = s.causal && j1 - 1 > i0;
          for (std::int64_t r = 0; r < nr; ++r) {
            T* srow = S.data() + r * Bc;
            if (on_diagonal) {
              for (std::int64_t c = 0; c < nc; ++c)
                if (j0 + c > i0 + r) srow[c] = neg_inf;
            }
            T mx = m[r];
            for (std::int64_t c = 0; c < nc; ++c) mx = std::max(mx, srow[c]);
            // Row r has at least key 0 once j0 == 0, so mx is finite from the first tile on.
            const T alpha = std::exp(m[r] - mx);   // exp(-inf) = 0 on the first tile
            T rowsum = 0;
            for (std::int64_t c = 0; c < nc; ++c) {
              srow[c] = std::exp(srow[c] - mx);
              rowsum += srow[c];
            }
            l[r] = alpha * l[r] + rowsum;
            m[r] = mx;
            T* arow = acc.data() + r * D;
            for (std::int64_t e = 0; e < D; ++e) arow[e] *= alpha;
          }
          // acc += P V_j
          gemm(false, false, nr, D, nc, T(1), S.data(), Bc, V + j0 * ld, ld, T(1), acc.data(), D);
        }
        for (std::int64_t r = 0; r < nr; ++r) {
          const T inv = T(1) / l[r];
          for (std::int64_t e = 0; e < D; ++e) O[(i0 + r) * ldo + e] = acc[r * D + e] * inv;
          L[i0 + r] = m[r] + std::log(l[r]);
        }
      }
    }
  }
}

template <class T>
void attention_flash_backward(const AttentionShape& s, const T* q, const T* k, const T* v, const T* o,
                              const T* lse, const T* dout, T* dq, T* dk, T* dv, FlashTiles tiles) {
  check_tiles(tiles);
  const std::int64_t Tn = s.seq, D = s.head_dim, ld = s.stride_t, ldo = s.o_stride_t, Br = tiles.q_tile,
                     Bc = tiles.k_tile;
  const T scale = static_cast<T>(s.softmax_scale());
  std::vector<T> P(static_cast<std::size_t>(Br * Bc));    // [Br, Bc]
  std::vector<T> dS(static_cast<std::size_t>(Br * Bc));   // dP, then dS  [Br, Bc]
  std::vector<T> Dvec(static_cast<std::size_t>(Tn));      // D_i = rowsum(dO_i * O_i)
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const std::int64_t off = head_offset(s, b, h);
      const std::int64_t ooff = o_head_offset(s, b, h);
      const T *Q = q + off, *K = k + off, *V = v + off, *O = o + ooff, *dO = dout + ooff;
      T *dQ = dq + off, *dK = dk + off, *dV = dv + off;
      const T* L = lse + (b * s.heads + h) * Tn;
      for (std::int64_t t = 0; t < Tn; ++t) {
        double acc = 0;
        for (std::int64_t e = 0; e < D; ++e) acc += static_cast<double>(dO[t * ldo + e]) * O[t * ldo + e];
        Dvec[static_cast<std::size_t>(t)] = static_cast<T>(acc);
      }
      zero_rows(dQ, 0, Tn, ld, D);
      for (std::int64_t j0 = 0; j0 < Tn; j0 += Bc) {
        const std::int64_t j1 = std::min(j0 + Bc, Tn), nc = j1 - j0;
        zero_rows(dK, j0, j1, ld, D);
        zero_rows(dV, j0, j1, ld, D);
        // Causal: queries before j0 see none of these keys; start at the tile holding query j0.
        const std::int64_t i_start = s.causal ? (j0 / Br) * Br : 0;
        for (std::int64_t i0 = i_start; i0 < Tn; i0 += Br) {
          const std::int64_t i1 = std::min(i0 + Br, Tn), nr = i1 - i0;
          const bool on_diagonal = s.causal && j1 - 1 > i0;
          // P = exp(scale * Q_i K_j^T - L_i), masked entries 0     [nr, nc]
          gemm(false, true, nr, nc, D, scale, Q + i0 * ld, ld, K + j0 * ld, ld, T(0), P.data(), Bc);
          for (std::int64_t r = 0; r < nr; ++r) {
            T* prow = P.data() + r * Bc;
            for (std::int64_t c = 0; c < nc; ++c)
              prow[c] = (on_diagonal && j0 + c > i0 + r) ? T(0) : std::exp(prow[c] - L[i0 + r]);
          }
          // dV_j += P^T dO_i
          gemm(true, false, nc, D, nr, T(1), P.data(), Bc, dO + i0 * ldo, ldo, T(1), dV + j0 * ld, ld);
          // dP = dO_i V_j^T ; dS = P * (dP - D_i)
          gemm(false, true, nr, nc, D, T(1), dO + i0 * ldo, ldo, V + j0 * ld, ld, T(0), dS.data(), Bc);
          for (std::int64_t r = 0; r < nr; ++r) {
            const T di = Dvec[static_cast<std::size_t>(i0 + r)];
            for (std::int64_t c = 0; c < nc; ++c) dS[r * Bc + c] = P[r * Bc + c] * (dS[r * Bc + c] - di);
          }
          // dQ_i += scale dS K_j ; dK_j += scale dS^T Q_i
          gemm(false, false, nr, D, nc, scale, dS.data(), Bc, K + j0 * ld, ld, T(1), dQ + i0 * ld, ld);
          gemm(true, false, nc, D, nr, scale, dS.data(), Bc, Q + i0 * ld, ld, T(1), dK + j0 * ld, ld);
        }
      }
    }
  }
}

template void attention_flash_forward<float>(const AttentionShape&, const float*, const float*, const float*, float*,
                                             float*, FlashTiles);
template void attention_flash_forward<double>(const AttentionShape&, const double*, const double*, const double*,
                                              double*, double*, FlashTiles);
template void attention_flash_backward<float>(const AttentionShape&, const float*, const float*, const float*,
                                              const float*, const float*, const float*, float*, float*, float*,
                                              FlashTiles);
template void attention_flash_backward<double>(const AttentionShape&, const double*, const double*, const double*,
                                               const double*, const double*, const double*, double*, double*,
                                               double*, FlashTiles);

}  // namespace lmscale::ops::cpu
