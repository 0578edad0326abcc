// How many matrix products a dense block issues (docs/architecture.md "Fused projections"): with
// q, k, v and w1, w3 back to back in the parameter store, each group is ONE product each way, so a
// block runs 4 forward (q|k|v, o, w1|w3, w2), 4 input-gradient and 4 weight-gradient products;
// selective-mlp rebuilds a|b with one more forward product, every-k checkpointing q|k|v, o, w1|w3.
// Counted through Context::linear_products (ops count at dispatch) as the difference between a
// model of 2 blocks and one of 1, so the embedding and the head drop out. A block whose w1|w3 (or
// q|k|v) fell back to one product per weight would count 2 (3) for that group and fail here.
#include <gtest/gtest.h>

#include "lmscale/model/parameter_store.h"
#include "lmscale/model/transformer.h"
#include "model_test_util.h"

using namespace lmscale;

namespace {

model::ModelDims dims(int layers) {
  model::ModelDims d;
  d.vocab = 11;
  d.context = 6;
  d.d_model = 8;
  d.d_ff = 12;
  d.layers = layers;
  d.heads = 2;
  return d;
}

struct Counts {
  LinearProductCounts forward, backward;   // during forward(), during backward()
};

// One training forward and backward of a `layers`-block model in `dtype` (master = compute).
Counts count_products(int layers, DType dtype, const model::RecomputePolicy& recompute) {
  test::CpuFixture f;
  const model::ModelDims d = dims(layers);
  model::ParameterStore ps(d, dtype, dtype, f.alloc);
  ps.init(5, f.ctx);
  model::TransformerLM m(d, ps);
  m.set_recompute(recompute);
  const Tensor x = test::int_tensor(f.alloc, 2, 5, d.vocab, 1), y = test::int_tensor(f.alloc, 2, 5, d.vocab, 2);
  Counts c;
  f.ctx.linear_products = &c.forward;
  auto act = m.forward(f.ctx, x, y, true, 0.1);
  f.ctx.linear_products = &c.backward;
  m.backward(f.ctx, *act, {});
  f.ctx.linear_products = nullptr;
  return c;
}

// One block's share: the 2-block model's counts minus the 1-block model's.
Counts per_block(DType dtype, const model::RecomputePolicy& recompute = {}) {
  const Counts one = count_products(1, dtype, recompute), two = count_products(2, dtype, recompute);
  auto minus = [](const LinearProductCounts& a, const LinearProductCounts& b) {
    return LinearProductCounts{a.forward - b.forward, a.data_grad - b.data_grad, a.weight_grad - b.weight_grad};
  };
  return {minus(two.forward, one.forward), minus(two.backward, one.backward)};
}

void expect(const LinearProductCounts& got, std::int64_t forward, std::int64_t data_grad, std::int64_t weight_grad,
            const char* what) {
  EXPECT_EQ(got.forward, forward) << what;
  EXPECT_EQ(got.data_grad, data_grad) << what;
  EXPECT_EQ(got.weight_grad, weight_grad) << what;
}

TEST(ModelFusedProducts, ADenseBlockIsFourProductsEachWay) {
  for (DType t : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(t));
    const Counts c = per_block(t);
    expect(c.forward, 4, 0, 0, "forward");
    expect(c.backward, 0, 4, 4, "backward");
  }
}

TEST(ModelFusedProducts, SelectiveMlpRebuildsABInOneProduct) {
  model::RecomputePolicy p;
  p.mode = model::RecomputePolicy::Mode::selective;
  p.mlp = true;
  const Counts c = per_block(DType::f32, p);
  expect(c.forward, 4, 0, 0, "forward");
  expect(c.backward, 1, 4, 4, "backward: a|b = y2 [W1; W3]^T again");
}

TEST(ModelFusedProducts, EveryKRecomputesTheBlocksFourProducts) {
  model::RecomputePolicy p;
  p.mode = model::RecomputePolicy::Mode::every_k;
  p.k = 1;
  const Counts c = per_block(DType::f32, p);
  expect(c.forward, 4, 0, 0, "forward");
  // The recompute of a group's last block (k = 1: every block) stops before w2, whose output the
  // backward does not read: q|k|v, o and w1|w3 again.
  expect(c.backward, 3, 4, 4, "backward: the recomputed forward, then the block's backward");
}

}  // namespace
