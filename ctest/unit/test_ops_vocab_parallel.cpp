// The vocabulary-parallel ops on the CPU in fp64 (ops/vocab_parallel.h): the logits [N, V] split
// into tp column shards, the all-reduces between the three cross-entropy steps done here by hand
// (elementwise max / sum over the shards' statistics), must give ops::cross_entropy's loss and
// gradient; the composed loss's gradient is checked against central differences; the sharded
// embedding's partial lookups sum to ops::embedding and its backward fills exactly the shard's
// rows of ops::embedding_backward.
#include <gtest/gtest.h>

#include <vector>

#include "gradcheck.h"
#include "lmscale/ops/vocab_parallel.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

// Columns [c0, c0 + w) of a [N, V] fp64 tensor, as a new [N, w] tensor (or written back).
void copy_columns(const Tensor& full, Tensor& part, std::int64_t c0, bool to_part) {
  const std::int64_t N = full.dim(0), V = full.dim(1), w = part.dim(1);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t j = 0; j < w; ++j) {
      double& a = full.data_as<double>()[n * V + c0 + j];
      double& b = part.data_as<double>()[n * w + j];
      if (to_part) b = a;
      else a = b;
    }
}

}  // namespace

class VocabParallelTest : public OpsTest {
 protected:
  // The vocabulary-parallel cross-entropy over `tp` shards of logits [N, V]; returns the loss sum of
  // shard 0 (every shard computes the same) and writes the shards' gradients into dlogits [N, V].
  double sharded_loss(const Tensor& logits, const Tensor& targets, int tp, double grad_scale,
                      Tensor* dlogits, std::vector<double>* losses = nullptr) {
    const std::int64_t N = logits.dim(0), V = logits.dim(1), Vl = V / tp;
    std::vector<Tensor> shards, maxes, sums;
    for (int r = 0; r < tp; ++r) {
      shards.push_back(zeros({N, Vl}));
      copy_columns(logits, shards.back(), r * Vl, true);
      maxes.push_back(zeros({N}));
      ops::vocab_parallel_max(ctx, shards.back(), maxes.back());
    }
    Tensor m = zeros({N});   // "all-reduce max"
    for (std::int64_t n = 0; n < N; ++n) {
      double v = maxes[0].data_as<double>()[n];
      for (int r = 1; r < tp; ++r) v = std::max(v, maxes[static_cast<std::size_t>(r)].data_as<double>()[n]);
      m.data_as<double>()[n] = v;
    }
    Tensor s = zeros({N, 2});   // "all-reduce sum"
    for (int r = 0; r < tp; ++r) {
      sums.push_back(zeros({N, 2}));
      ops::vocab_parallel_sums(ctx, shards[static_cast<std::size_t>(r)], targets, r * Vl, m, sums.back());
      for (std::int64_t i = 0; i < 2 * N; ++i) s.data_as<double>()[i] += sums.back().data_as<double>()[i];
    }
    double first = 0;
    for (int r = 0; r < tp; ++r) {
      Tensor loss = zeros({1});
      Tensor g = zeros({N, Vl});
      Tensor& shard = shards[static_cast<std::size_t>(r)];
      // In place (dlogits over logits) on odd ranks, a separate buffer on even ones: both allowed.
      Tensor* out = dlogits ? (r % 2 ? &shard : &g) : nullptr;
      ops::vocab_parallel_loss(ctx, shard, targets, r * Vl, m, s, loss, out, grad_scale);
      if (dlogits) copy_columns(*dlogits, *out, r * Vl, false);
      if (r == 0) first = loss.data_as<double>()[0];
      if (losses) losses->push_back(loss.data_as<double>()[0]);
    }
    return first;
  }
};

TEST_F(VocabParallelTest, ShardedCrossEntropyEqualsTheFullOne) {
  const std::int64_t N = 6, V = 12;
  const std::vector<std::int32_t> tv = {0, 11, 5, 6, 3, 9};
  Tensor logits = randn({N, V}, 7, 3.0), tgt = ids({N}, tv);
  Tensor ref_loss = poisoned({1}), ref_grad = poisoned({N, V});
  const double gs = 0.25;
  ops::cross_entropy(ctx, logits, tgt, ref_loss, &ref_grad, gs);
  for (int tp : {1, 2, 3, 4, 6}) {
    Tensor grad = poisoned({N, V});
    std::vector<double> losses;
    const double loss = sharded_loss(logits, tgt, tp, gs, &grad, &losses);
    EXPECT_NEAR(loss, ref_loss.data_as<double>()[0], 1e-12) << "tp " << tp;
    for (double l : losses) EXPECT_EQ(l, loss) << "tp " << tp << ": the shards disagree on the loss";
    EXPECT_LT(max_rel_diff(grad, ref_grad), 1e-13) << "tp " << tp;
  }
}

TEST_F(VocabParallelTest, HugeLogitsStayFinite) {
  const std::int64_t N = 2, V = 8;
  Tensor logits = randn({N, V}, 3), tgt = ids({N}, {1, 6});
  Tensor ref = poisoned({1});
  ops::cross_entropy(ctx, logits, tgt, ref, nullptr, 1.0);
  // One shard's logits exceed exp's range: the shared max keeps every exponent <= 0.
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t j = 0; j < V; ++j) logits.data_as<double>()[n * V + j] += 1000.0;
  Tensor grad = poisoned({N, V});
  EXPECT_NEAR(sharded_loss(logits, tgt, 2, 1.0, &grad), ref.data_as<double>()[0], 1e-10);
  for (double g : values(grad)) EXPECT_TRUE(std::isfinite(g));
}

TEST_F(VocabParallelTest, GradientMatchesFiniteDifferences) {
  const std::int64_t N = 4, V = 9;
  const double gs = 0.6;
  Tensor logits = randn({N, V}, 11, 2.0), tgt = ids({N}, {8, 0, 4, 4});
  Tensor grad = poisoned({N, V});
  sharded_loss(logits, tgt, 3, gs, &grad);
  const auto f = [&] { return gs * sharded_loss(logits, tgt, 3, 1.0, nullptr); };
  expect_gradcheck_ok(gradcheck(f, {{"logits", &logits, &grad}}));
}

TEST_F(VocabParallelTest, ShardedEmbeddingSumsToTheFullLookup) {
  const std::int64_t V = 10, d = 3, N = 7;
  Tensor table = randn({V, d}, 5), id = ids({N}, {0, 9, 4, 5, 4, 2, 7});
  Tensor ref = poisoned({N, d});
  ops::embedding(ctx, id, table, ref);
  Tensor dout = randn({N, d}, 6);
  Tensor ref_grad = zeros({V, d});
  ops::embedding_backward(ctx, id, dout, ref_grad);
  for (int tp : {1, 2, 5}) {
    const std::int64_t Vl = V / tp;
    Tensor sum = zeros({N, d});
    for (int r = 0; r < tp; ++r) {
      Tensor shard = clone(table.slice(r * Vl, (r + 1) * Vl));
      Tensor part = poisoned({N, d});
      ops::embedding_shard(ctx, id, shard, r * Vl, part);
      ops::add(ctx, sum, part, sum);
      Tensor g = zeros({Vl, d});
      ops::embedding_shard_backward(ctx, id, dout, r * Vl, g);
      EXPECT_EQ(values(g), values(ref_grad.slice(r * Vl, (r + 1) * Vl))) << "tp " << tp << " rank " << r;
    }
    EXPECT_EQ(values(sum), values(ref)) << "tp " << tp;
  }
}

}  // namespace lmscale::test
