// ops::embedding / embedding_backward on the CPU: gather exactness, scatter-add with repeated ids
// by central differences, accumulation, determinism, fp32 vs fp64, out-of-range ids, bad shapes.
#include <gtest/gtest.h>

#include <cstring>

#include "gradcheck.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

using EmbeddingTest = OpsTest;

TEST_F(EmbeddingTest, ForwardGathersRows) {
  Tensor table = randn({5, 3}, 1), id = ids({2, 3}, {4, 0, 4, 2, 2, 1}), out = poisoned({2, 3, 3});
  ops::embedding(ctx, id, table, out);
  const auto t = values(table), o = values(out);
  const std::int32_t* p = id.data_as<std::int32_t>();
  for (int n = 0; n < 6; ++n)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(o[n * 3 + j], t[p[n] * 3 + j]) << n << "," << j;
}

TEST_F(EmbeddingTest, BackwardWithRepeatedIdsMatchesFiniteDifferences) {
  const std::int64_t V = 4, d = 3;
  Tensor table = randn({V, d}, 2), id = ids({6}, {1, 3, 1, 1, 0, 3}), r = randn({6, d}, 3);
  Tensor out = poisoned({6, d}), dtable = zeros({V, d});   // backward accumulates: start from 0
  ops::embedding_backward(ctx, id, r, dtable);
  // Row 2 is never used: its gradient must stay exactly 0.
  for (std::int64_t j = 0; j < d; ++j) EXPECT_EQ(dtable.data_as<double>()[2 * d + j], 0.0);
  // Row 1 collects three rows of r.
  for (std::int64_t j = 0; j < d; ++j) {
    const double* rp = r.data_as<double>();
    EXPECT_NEAR(dtable.data_as<double>()[1 * d + j], rp[0 * d + j] + rp[2 * d + j] + rp[3 * d + j], 1e-15);
  }
  const auto f = [&] {
    ops::embedding(ctx, id, table, out);
    return dot(out, r);
  };
  expect_gradcheck_ok(gradcheck(f, {{"table", &table, &dtable}}));
}

TEST_F(EmbeddingTest, BackwardAccumulatesAndIsDeterministic) {
  Tensor id = ids({5}, {2, 2, 0, 2, 1}), dout = randn({5, 4}, 4);
  Tensor base = randn({3, 4}, 5), a = clone(base), b = clone(base);
  ops::embedding_backward(ctx, id, dout, a);
  ops::embedding_backward(ctx, id, dout, b);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  const double* g = dout.data_as<double>();
  for (int j = 0; j < 4; ++j) {
    // Row 2 = base + dout rows 0, 1, 3 added in that order.
    const double want = ((base.data_as<double>()[8 + j] + g[0 * 4 + j]) + g[1 * 4 + j]) + g[3 * 4 + j];
    EXPECT_EQ(a.data_as<double>()[8 + j], want);
  }
}

TEST_F(EmbeddingTest, Fp32AgreesWithFp64) {
  Tensor table = randn({6, 5}, 6), id = ids({4}, {5, 0, 3, 3}), out = poisoned({4, 5});
  Tensor table32 = as(table, DType::f32), out32 = poisoned({4, 5}, DType::f32);
  ops::embedding(ctx, id, table, out);
  ops::embedding(ctx, id, table32, out32);
  EXPECT_LT(max_rel_diff(out32, out), 1e-7);
  Tensor dout = randn({4, 5}, 7), dt = zeros({6, 5}), dt32 = zeros({6, 5}, DType::f32);
  Tensor dout32 = as(dout, DType::f32);
  ops::embedding_backward(ctx, id, dout, dt);
  ops::embedding_backward(ctx, id, dout32, dt32);
  EXPECT_LT(max_rel_diff(dt32, dt), 1e-6);
}

TEST_F(EmbeddingTest, OutOfRangeIdsThrow) {
  Tensor table = randn({4, 2}, 8), out = poisoned({2, 2}), dtable = zeros({4, 2}), dout = randn({2, 2}, 9);
  for (std::int32_t bad : {-1, 4, 1000}) {
    Tensor id = ids({2}, {0, bad});
    EXPECT_THROW(ops::embedding(ctx, id, table, out), Error) << bad;
    EXPECT_THROW(ops::embedding_backward(ctx, id, dout, dtable), Error) << bad;
  }
}

TEST_F(EmbeddingTest, BadShapesAndDtypesThrow) {
  Tensor table = randn({4, 3}, 10), id = ids({2}, {0, 1});
  Tensor out_bad = poisoned({2, 4});
  EXPECT_THROW(ops::embedding(ctx, id, table, out_bad), Error);   // wrong d
  Tensor out_rows = poisoned({3, 3});
  EXPECT_THROW(ops::embedding(ctx, id, table, out_rows), Error);  // wrong row count
  Tensor id_f = randn({2}, 11), out = poisoned({2, 3});
  EXPECT_THROW(ops::embedding(ctx, id_f, table, out), Error);     // ids must be int32
  Tensor out32 = poisoned({2, 3}, DType::f32);
  EXPECT_THROW(ops::embedding(ctx, id, table, out32), Error);     // dtype mismatch
  Tensor dout32 = randn({2, 3}, 12, 1.0, 0.0, DType::f32), dtable = zeros({4, 3});
  EXPECT_THROW(ops::embedding_backward(ctx, id, dout32, dtable), Error);   // CPU: one dtype
}

}  // namespace
}  // namespace lmscale::test
