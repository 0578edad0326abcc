// CPU attention: naive and tiled FlashAttention-2 (float, double) against an independent float64
// loop reference for O and L, flash backward against the naive backward, and the naive backward
// against central finite differences in float64. Sizes that are not tile multiples, causal or not,
// both layouts ([B,T,H,D] of the model, [B,H,T,D] of the bench).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "../../src/ops/cpu/attention_cpu.h"
#include "lmscale/core/context.h"
#include "lmscale/core/error.h"
#include "lmscale/core/rng.h"
#include "lmscale/ops/ops.h"

namespace {

using lmscale::CounterRng;
using lmscale::ops::AttentionShape;
namespace cpu = lmscale::ops::cpu;

std::int64_t extent(const AttentionShape& s) { return s.batch * s.heads * s.seq * s.head_dim; }

std::vector<double> random_vec(std::int64_t n, std::uint64_t key, double scale = 1.0) {
  CounterRng rng(1234, key);
  std::vector<double> x(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] = scale * rng.normal(static_cast<std::uint64_t>(i));
  return x;
}

template <class T>
std::vector<T> cast_vec(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

// ||a - b|| / ||b||; when ||b|| is tiny (dQ, dK vanish for T = 1) the error is absolute.
template <class A>
double rel_err(const std::vector<A>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    if (std::isnan(static_cast<double>(a[i]))) return std::numeric_limits<double>::infinity();
    num += d * d;
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-3);
}

// Independent float64 reference with plain loops: O and L = logsumexp of the scaled scores.
void loop_reference(const AttentionShape& s, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, std::vector<double>& o, std::vector<double>& lse) {
  const double scale = s.softmax_scale();
  o.assign(q.size(), 0.0);
  lse.assign(static_cast<std::size_t>(s.batch * s.heads * s.seq), 0.0);
  std::vector<double> p(static_cast<std::size_t>(s.seq));
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const std::int64_t off = b * s.stride_b + h * s.stride_h;
      for (std::int64_t i = 0; i < s.seq; ++i) {
        const std::int64_t nk = s.causal ? i + 1 : s.seq;
        double mx = -1e300;
        for (std::int64_t j = 0; j < nk; ++j) {
          double dot = 0;
          for (std::int64_t e = 0; e < s.head_dim; ++e)
            dot += q[static_cast<std::size_t>(off + i * s.stride_t + e)] * k[static_cast<std::size_t>(off + j * s.stride_t + e)];
          p[static_cast<std::size_t>(j)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < nk; ++j) sum += std::exp(p[static_cast<std::size_t>(j)] - mx);
        for (std::int64_t e = 0; e < s.head_dim; ++e) {
          double acc = 0;
          for (std::int64_t j = 0; j < nk; ++j)
            acc += std::exp(p[static_cast<std::size_t>(j)] - mx) * v[static_cast<std::size_t>(off + j * s.stride_t + e)];
          o[static_cast<std::size_t>(off + i * s.stride_t + e)] = acc / sum;
        }
        lse[static_cast<std::size_t>((b * s.heads + h) * s.seq + i)] = mx + std::log(sum);
      }
    }
}

struct Case {
  std::int64_t B, H, T, D;
  bool causal;
  bool bthd;
  std::int64_t br, bc;
};

AttentionShape make_shape(const Case& c) {
  return c.bthd ? AttentionShape::bthd(c.B, c.T, c.H, c.D, c.causal) : AttentionShape::bhtd(c.B, c.H, c.T, c.D, c.causal);
}

class AttentionCpu : public ::testing::TestWithParam<Case> {};

template <class T>
void run_case(const Case& c, double tol_o, double tol_grad) {
  const AttentionShape s = make_shape(c);
  const std::int64_t n = extent(s), nl = s.batch * s.heads * s.seq;
  const std::uint64_t key = static_cast<std::uint64_t>(c.T * 1000 + c.D * 10 + c.causal);
  const auto q = random_vec(n, key + 1), k = random_vec(n, key + 2), v = random_vec(n, key + 3),
             dout = random_vec(n, key + 4);
  std::vector<double> o_ref, l_ref;
  loop_reference(s, q, k, v, o_ref, l_ref);

  // float64 naive: the gradient reference (itself checked by finite differences below).
  std::vector<double> o64(static_cast<std::size_t>(n)), p64(static_cast<std::size_t>(nl * s.seq));
  std::vector<double> dq64(o64.size()), dk64(o64.size()), dv64(o64.size());
  cpu::attention_naive_forward(s, q.data(), k.data(), v.data(), o64.data(), p64.data());
  cpu::attention_naive_backward(s, q.data(), k.data(), v.data(), p64.data(), dout.data(), dq64.data(), dk64.data(),
                                dv64.data());
  EXPECT_LT(rel_err(o64, o_ref), 1e-12);

  const auto qt = cast_vec<T>(q), kt = cast_vec<T>(k), vt = cast_vec<T>(v), dt = cast_vec<T>(dout);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  // naive in T
  std::vector<T> o(static_cast<std::size_t>(n), nan), p(p64.size(), nan), dq(o.size(), nan), dk(o.size(), nan),
      dv(o.size(), nan);
  cpu::attention_naive_forward(s, qt.data(), kt.data(), vt.data(), o.data(), p.data());
  cpu::attention_naive_backward(s, qt.data(), kt.data(), vt.data(), p.data(), dt.data(), dq.data(), dk.data(), dv.data());
  EXPECT_LT(rel_err(o, o_ref), tol_o) << "naive O";
  EXPECT_LT(rel_err(dq, dq64), tol_grad) << "naive dQ";
  EXPECT_LT(rel_err(dk, dk64), tol_grad) << "naive dK";
  EXPECT_LT(rel_err(dv, dv64), tol_grad) << "naive dV";

  // tiled flash in T, poisoned outputs
  std::vector<T> fo(o.size(), nan), fl(static_cast<std::size_t>(nl), nan), fdq(o.size(), nan), fdk(o.size(), nan),
      fdv(o.size(), nan);
  const cpu::FlashTiles tiles{c.br, c.bc};
  cpu::attention_flash_forward(s, qt.data(), kt.data(), vt.data(), fo.data(), fl.data(), tiles);
  cpu::attention_flash_backward(s, qt.data(), kt.data(), vt.data(), fo.data(), fl.data(), dt.data(), fdq.data(),
                                fdk.data(), fdv.data(), tiles);
  EXPECT_LT(rel_err(fo, o_ref), tol_o) << "flash O";
  EXPECT_LT(rel_err(fl, l_ref), tol_o) << "flash L";
  EXPECT_LT(rel_err(fdq, dq64), tol_grad) << "flash dQ";
  EXPECT_LT(rel_err(fdk, dk64), tol_grad) << "flash dK";
  EXPECT_LT(rel_err(fdv, dv64), tol_grad) << "flash dV";
}

TEST_P(AttentionCpu, DoubleMatchesReference) { run_case<double>(GetParam(), 1e-12, 1e-11); }
TEST_P(AttentionCpu, FloatMatchesReference) { run_case<float>(GetParam(), 2e-6, 2e-5); }

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionCpu,
                         ::testing::Values(Case{1, 1, 1, 16, true, false, 16, 16},     // one token
                                           Case{2, 3, 17, 16, true, true, 16, 16},     // T not a tile multiple
                                           Case{1, 2, 17, 32, false, false, 16, 32},
                                           Case{2, 2, 100, 32, true, false, 32, 16},   // Br != Bc
                                           Case{1, 2, 100, 64, false, true, 16, 48},
                                           Case{1, 1, 257, 64, true, true, 64, 64},
                                           Case{1, 1, 257, 128, false, false, 48, 32},
                                           Case{1, 2, 130, 16, true, false, 64, 16}));

// Finite differences of loss = sum(O * W) in float64 for the naive backward.
TEST(AttentionCpuGrad, NaiveBackwardMatchesFiniteDifferences) {
  for (bool causal : {true, false}) {
    const AttentionShape s = AttentionShape::bthd(2, 5, 2, 8, causal);
    const std::int64_t n = extent(s);
    auto q = random_vec(n, 11), k = random_vec(n, 12), v = random_vec(n, 13);
    const auto w = random_vec(n, 14);
    std::vector<double> o(static_cast<std::size_t>(n)), p(static_cast<std::size_t>(s.batch * s.heads * s.seq * s.seq));
    auto loss = [&]() {
      cpu::attention_naive_forward(s, q.data(), k.data(), v.data(), o.data(), p.data());
      double l = 0;
      for (std::size_t i = 0; i < o.size(); ++i) l += o[i] * w[i];
      return l;
    };
    loss();
    std::vector<double> dq(o.size()), dk(o.size()), dv(o.size());
    cpu::attention_naive_backward(s, q.data(), k.data(), v.data(), p.data(), w.data(), dq.data(), dk.data(), dv.data());
    const double h = 1e-6;
    for (auto [x, g] : {std::pair{&q, &dq}, {&k, &dk}, {&v, &dv}}) {
      for (std::size_t i = 0; i < x->size(); ++i) {
        const double x0 = (*x)[i];
        (*x)[i] = x0 + h;
        const double lp = loss();
        (*x)[i] = x0 - h;
        const double lm = loss();
        (*x)[i] = x0;
        const double fd = (lp - lm) / (2 * h);
        EXPECT_NEAR((*g)[i], fd, 1e-7 * std::max(1.0, std::abs(fd))) << "causal " << causal << " element " << i;
      }
    }
  }
}

// The public ops:: entry points dispatch to the same CPU code and check their arguments.
TEST(AttentionCpuOps, PublicApiMatchesAndChecksShapes) {
  lmscale::HostAllocator host;
  lmscale::Context ctx;
  ctx.allocator = &host;
  ctx.host = &host;
  const AttentionShape s = AttentionShape::bthd(1, 33, 2, 16, true);
  const std::int64_t n = extent(s);
  auto mk = [&](std::int64_t count, std::uint64_t key) {
    auto t = lmscale::Tensor::empty({count}, lmscale::DType::f64, host);
    const auto x = random_vec(count, key);
    std::copy(x.begin(), x.end(), t.data_as<double>());
    return t;
  };
  auto q = mk(n, 1), k = mk(n, 2), v = mk(n, 3), dout = mk(n, 4);
  auto o = mk(n, 5), on = mk(n, 6), lse = mk(s.batch * s.heads * s.seq, 7), probs = mk(s.batch * s.heads * s.seq * s.seq, 8);
  auto dq = mk(n, 9), dk = mk(n, 10), dv = mk(n, 11), dqn = mk(n, 12), dkn = mk(n, 13), dvn = mk(n, 14);
  lmscale::ops::attention_flash(ctx, s, q, k, v, o, lse);
  lmscale::ops::attention_flash_backward(ctx, s, q, k, v, o, lse, dout, dq, dk, dv);
  lmscale::ops::attention_naive(ctx, s, q, k, v, on, probs);
  lmscale::ops::attention_naive_backward(ctx, s, q, k, v, probs, dout, dqn, dkn, dvn);
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(o.data_as<double>()[i], on.data_as<double>()[i], 1e-12);
    EXPECT_NEAR(dq.data_as<double>()[i], dqn.data_as<double>()[i], 1e-11);
    EXPECT_NEAR(dk.data_as<double>()[i], dkn.data_as<double>()[i], 1e-11);
    EXPECT_NEAR(dv.data_as<double>()[i], dvn.data_as<double>()[i], 1e-11);
  }
  auto short_lse = mk(5, 15);
  EXPECT_THROW(lmscale::ops::attention_flash(ctx, s, q, k, v, o, short_lse), lmscale::Error);
  auto small = mk(n - 1, 16);
  EXPECT_THROW(lmscale::ops::attention_flash(ctx, s, q, k, small, o, lse), lmscale::Error);
}

}  // namespace
