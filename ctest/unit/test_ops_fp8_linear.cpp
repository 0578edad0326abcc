// ops::Fp8Linear on the CPU: its forward and backward equal the FP8 primitives composed by hand
// (docs/precision.md, "The GEMMs and their layouts"), stay within the derived bound of the exact
// products, accumulate dw, and keep each forward's operands for its own backward when several
// forwards run before their backwards (pipeline schedules).
#include <gtest/gtest.h>

#include <cstdint>

#include <cmath>
#include <cstring>
#include <vector>

#include "lmscale/core/error.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/fp8_linear.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

class Fp8LinearTest : public OpsTest {
 protected:
  static constexpr std::int64_t B = 2, T = 12, K = 48, N = 16, M = B * T;

  // The three products from the primitives: x, w as e4m3, dy as e5m2, current scaling.
  struct Products {
    Tensor y, dx, dw;
  };
  Products by_hand(const Tensor& x, const Tensor& w, const Tensor& dy) {
    auto q = [&](const Tensor& t, Fp8Format f, Tensor& inv) {
      ops::Fp8TensorScaling s(ctx, f, ops::Fp8Recipe::current, 1, 0);
      const Tensor m = t.reshape({t.numel() / t.dim(-1), t.dim(-1)});
      Tensor out = Tensor::empty(m.shape(), fp8_dtype(f), alloc, "test");
      s.quantize(ctx, m, out);
      inv = clone(s.inv_scale());
      return out;
    };
    auto tr = [&](const Tensor& t) {
      Tensor o = Tensor::empty({t.dim(1), t.dim(0)}, t.dtype(), alloc, "test");
      ops::transpose_fp8(ctx, t, o);
      return o;
    };
    Tensor xi, wi, dyi;
    const Tensor xq = q(x, Fp8Format::e4m3, xi), wq = q(w, Fp8Format::e4m3, wi), dyq = q(dy, Fp8Format::e5m2, dyi);
    Products p{poisoned({M, N}), poisoned({M, K}), poisoned({N, K})};
    ops::linear_fp8(ctx, xq, xi, wq, wi, p.y, false);
    ops::linear_fp8(ctx, dyq, dyi, tr(wq), wi, p.dx, false);
    ops::linear_fp8(ctx, tr(dyq), dyi, tr(xq), xi, p.dw, false);
    return p;
  }
};

void expect_equal(const Tensor& got, const Tensor& want, const char* what) {
  const auto g = values(got), w = values(want);
  ASSERT_EQ(g.size(), w.size()) << what;
  std::size_t diffs = 0;
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!(g[i] == w[i]) && ++diffs <= 5) ADD_FAILURE() << what << " element " << i << ": " << g[i] << " vs " << w[i];
  EXPECT_EQ(diffs, 0u) << what;
}

TEST_F(Fp8LinearTest, EqualsThePrimitivesAndTheExactProductsWithinTheBound) {
  const Tensor x = randn({B, T, K}, 1), w = randn({N, K}, 2, 0.1), dy = randn({B, T, N}, 3, 1e-3);
  ops::Fp8Linear layer(ctx, {});
  Tensor y = poisoned({B, T, N}), dx = poisoned({B, T, K}), dw = poisoned({N, K});
  const ops::Fp8LinearSaved saved = layer.forward(ctx, x, w, y);
  layer.backward(ctx, saved, dy, &dx, &dw, false);
  const Products want = by_hand(x, w, dy);
  expect_equal(y, want.y, "y");
  expect_equal(dx, want.dx, "dx");
  expect_equal(dw, want.dw, "dw");
  // Against the exact fp64 layer: within a few percent normwise (the elementwise bound is
  // test_ops_fp8's LinearLayerWithinDerivedBound), and not equal to it.
  Tensor ye = poisoned({B, T, N}), dxe = poisoned({B, T, K}), dwe = poisoned({N, K});
  ops::linear(ctx, x, w, ye);
  ops::linear_backward(ctx, x, w, dy, &dxe, &dwe, false);
  for (auto [got, exact, what] : {std::tuple{&y, &ye, "y"}, {&dx, &dxe, "dx"}, {&dw, &dwe, "dw"}}) {
    const double rel = max_rel_diff(*got, *exact);
    EXPECT_GT(rel, 1e-4) << what;
    EXPECT_LT(rel, 0.15) << what;
  }
  // accumulate_dw adds; a null dx or dw is skipped.
  Tensor dw2 = clone(dw);
  layer.backward(ctx, saved, dy, nullptr, &dw2, true);
  const auto once = values(dw), twice = values(dw2);
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_DOUBLE_EQ(twice[i], 2 * once[i]) << i;
}

TEST_F(Fp8LinearTest, EachBackwardUsesItsOwnForward) {
  const Tensor w = randn({N, K}, 2, 0.1);
  const Tensor x1 = randn({M, K}, 4), x2 = randn({M, K}, 5, 300.0);   // very different scales
  const Tensor dy1 = randn({M, N}, 6, 1e-3), dy2 = randn({M, N}, 7, 1.0);
  ops::Fp8Linear layer(ctx, {});
  Tensor y1 = poisoned({M, N}), y2 = poisoned({M, N});
  const ops::Fp8LinearSaved s1 = layer.forward(ctx, x1, w, y1);
  const ops::Fp8LinearSaved s2 = layer.forward(ctx, x2, w, y2);   // before the first backward
  Tensor dx1 = poisoned({M, K}), dw1 = poisoned({N, K}), dx2 = poisoned({M, K}), dw2 = poisoned({N, K});
  layer.backward(ctx, s1, dy1, &dx1, &dw1, false);
  layer.backward(ctx, s2, dy2, &dx2, &dw2, false);
  const Products p1 = by_hand(x1, w, dy1), p2 = by_hand(x2, w, dy2);
  expect_equal(y1, p1.y, "y1");
  expect_equal(dw1, p1.dw, "dw1");
  expect_equal(dx1, p1.dx, "dx1");
  expect_equal(y2, p2.y, "y2");
  expect_equal(dw2, p2.dw, "dw2");
}

TEST_F(Fp8LinearTest, DelayedScalingSaturatesOnlyTheFirstStep) {
  // Delayed scaling starts at scale 1: x with |x| up to ~1500 saturates at 448 on the first
  // forward; from the second on the history knows the range and the layer is accurate again.
  const Tensor x = randn({M, K}, 8, 500.0), w = randn({N, K}, 2, 0.1);
  ops::Fp8LinearOptions o;
  o.recipe = ops::Fp8Recipe::delayed;
  o.history = 4;
  ops::Fp8Linear layer(ctx, o);
  Tensor exact = poisoned({M, N});
  ops::linear(ctx, x, w, exact);
  Tensor y = poisoned({M, N});
  layer.forward(ctx, x, w, y);
  const double first = max_rel_diff(y, exact);
  layer.forward(ctx, x, w, y);
  const double second = max_rel_diff(y, exact);
  EXPECT_GT(first, 0.15);
  EXPECT_LT(second, 0.1);
}

TEST_F(Fp8LinearTest, ReplayRepeatsTheForwardWithoutTouchingTheScaling) {
  // Activation checkpointing's recompute (model/transformer_fp8.cpp): replay() with a forward's
  // saved scales gives that forward's y, x^T and w^T bitwise, even after later forwards moved the
  // delayed scales, and leaves the amax history and its slot as they were.
  const Tensor w = randn({N, K}, 2, 0.1), x = randn({M, K}, 4), later = randn({M, K}, 5, 300.0);
  ops::Fp8LinearOptions o;
  o.recipe = ops::Fp8Recipe::delayed;
  o.history = 3;
  ops::Fp8Linear layer(ctx, o);
  Tensor y = poisoned({M, N}), scratch = poisoned({M, N});
  layer.forward(ctx, x, w, scratch);   // a first cast in the history, so the next scale is not 1
  const ops::Fp8LinearSaved first = layer.forward(ctx, x, w, y);
  // The saved inverse scales are the backward GEMMs' scale pointers: each on its own 16-byte line
  // (ops/fp8_linear.h; packed, the CUDA backward failed), with the values of the forward's scales.
  for (const Tensor& t : {first.x_scale(), first.x_inv(), first.w_scale(), first.w_inv()})
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 16, 0u);
  EXPECT_EQ(values(first.x_inv()), values(layer.x_scaling().inv_scale()));
  EXPECT_EQ(values(first.w_scale()), values(layer.w_scaling().scale()));
  layer.forward(ctx, later, w, scratch);   // moves the scales
  const auto history = values(layer.x_scaling().amax_history());
  const int slot = layer.x_scaling().next_slot(ctx);
  Tensor y2 = poisoned({M, N});
  const ops::Fp8LinearSaved again = layer.replay(ctx, first.scales, x, w, &y2);
  expect_equal(y2, y, "replayed y");
  ASSERT_EQ(again.xt_q.numel(), first.xt_q.numel());
  EXPECT_EQ(std::memcmp(again.xt_q.data(), first.xt_q.data(), static_cast<std::size_t>(first.xt_q.numel())), 0);
  EXPECT_EQ(std::memcmp(again.wt_q.data(), first.wt_q.data(), static_cast<std::size_t>(first.wt_q.numel())), 0);
  EXPECT_EQ(values(layer.x_scaling().amax_history()), history);
  EXPECT_EQ(layer.x_scaling().next_slot(ctx), slot);
  // Without an output only the operands are made (the last block of a recompute).
  const ops::Fp8LinearSaved operands = layer.replay(ctx, first.scales, x, w, nullptr);
  EXPECT_EQ(std::memcmp(operands.xt_q.data(), first.xt_q.data(), static_cast<std::size_t>(first.xt_q.numel())), 0);
  // A backward from the replayed entry equals one from the first.
  const Tensor dy = randn({M, N}, 6, 1e-3);
  Tensor dx1 = poisoned({M, K}), dw1 = poisoned({N, K}), dx2 = poisoned({M, K}), dw2 = poisoned({N, K});
  layer.backward(ctx, first, dy, &dx1, &dw1, false);
  ops::Fp8Linear twin(ctx, o);   // dy's own scaling, in the same state as the first backward's
  twin.backward(ctx, again, dy, &dx2, &dw2, false);
  expect_equal(dw2, dw1, "dw from the replay");
  expect_equal(dx2, dx1, "dx from the replay");
}

TEST_F(Fp8LinearTest, AForwardWithoutRecordLeavesDelayedScalingAlone) {
  // An evaluation forward (record = false) casts with the history's scale and records nothing.
  const Tensor w = randn({N, K}, 2, 0.1), x = randn({M, K}, 4, 10.0);
  ops::Fp8LinearOptions o;
  o.recipe = ops::Fp8Recipe::delayed;
  o.history = 2;
  ops::Fp8Linear layer(ctx, o);
  Tensor y = poisoned({M, N});
  layer.forward(ctx, x, w, y);
  const auto history = values(layer.x_scaling().amax_history());
  layer.forward(ctx, randn({M, K}, 9, 1000.0), w, y, false);
  EXPECT_EQ(values(layer.x_scaling().amax_history()), history);
  EXPECT_EQ(layer.x_scaling().next_slot(ctx), 1);
  layer.forward(ctx, x, w, y);   // a training forward records again
  EXPECT_NE(values(layer.x_scaling().amax_history()), history);
}

TEST_F(Fp8LinearTest, ASharedInputIsEachLayersOwnQuantisation) {
  // Layers reading one input may share one quantisation of it (Fp8Input): under current scaling
  // its scale is that of x alone, so every layer's y, saved operands, scales and backward are
  // bitwise those of a layer quantising x itself; the shared x^T is one tensor.
  const Tensor x = randn({B, T, K}, 1, 3.0), w1 = randn({N, K}, 2, 0.1), w2 = randn({N, K}, 3, 7.0);
  const Tensor dy = randn({B, T, N}, 4, 1e-2);
  ops::Fp8Linear owner(ctx, {}), reader(ctx, {}), alone1(ctx, {}), alone2(ctx, {});
  const ops::Fp8Input xq = owner.quantize_input(ctx, x);
  Tensor y1 = poisoned({B, T, N}), y2 = poisoned({B, T, N}), r1 = poisoned({B, T, N}), r2 = poisoned({B, T, N});
  const ops::Fp8LinearSaved s1 = owner.forward(ctx, xq, w1, y1), s2 = reader.forward(ctx, xq, w2, y2);
  const ops::Fp8LinearSaved a1 = alone1.forward(ctx, x, w1, r1), a2 = alone2.forward(ctx, x, w2, r2);
  expect_equal(y1, r1, "y of the owner");
  expect_equal(y2, r2, "y of the reader");
  EXPECT_EQ(s1.xt_q.data(), s2.xt_q.data()) << "the readers' x^T is one tensor";
  for (auto [got, want] : {std::pair{&s1, &a1}, std::pair{&s2, &a2}}) {
    EXPECT_EQ(std::memcmp(got->xt_q.data(), want->xt_q.data(), static_cast<std::size_t>(want->xt_q.numel())), 0);
    EXPECT_EQ(std::memcmp(got->wt_q.data(), want->wt_q.data(), static_cast<std::size_t>(want->wt_q.numel())), 0);
    for (auto [g, w] : {std::pair{got->x_scale(), want->x_scale()}, {got->x_inv(), want->x_inv()},
                        {got->w_scale(), want->w_scale()}, {got->w_inv(), want->w_inv()}})
      EXPECT_EQ(values(g), values(w));
  }
  Tensor dx = poisoned({B, T, K}), dw = poisoned({N, K}), dxa = poisoned({B, T, K}), dwa = poisoned({N, K});
  reader.backward(ctx, s2, dy, &dx, &dw, false);
  alone2.backward(ctx, a2, dy, &dxa, &dwa, false);
  expect_equal(dx, dxa, "dx of the reader");
  expect_equal(dw, dwa, "dw of the reader");
  // A replay of the shared input with a saved entry's scales: the same operands again, and the
  // reader's replay from it the same y.
  const ops::Fp8Input again = reader.replay_input(ctx, s2.scales, x, true);
  EXPECT_EQ(std::memcmp(again.qt.data(), s2.xt_q.data(), static_cast<std::size_t>(s2.xt_q.numel())), 0);
  Tensor y3 = poisoned({B, T, N});
  const ops::Fp8LinearSaved s3 = reader.replay(ctx, s2.scales, again, w2, &y3);
  expect_equal(y3, y2, "replayed y of the reader");
  EXPECT_EQ(std::memcmp(s3.wt_q.data(), s2.wt_q.data(), static_cast<std::size_t>(s2.wt_q.numel())), 0);
  EXPECT_FALSE(reader.replay_input(ctx, s2.scales, x, false).q.defined()) << "no GEMM: no direct operand";
}

TEST_F(Fp8LinearTest, ASharedInputRecordsOneAmaxPerCastUnderDelayedScaling) {
  // Delayed scaling: the shared input has one amax history, which one quantize_input advances by
  // one slot however many layers read it.
  ops::Fp8LinearOptions o;
  o.recipe = ops::Fp8Recipe::delayed;
  o.history = 4;
  ops::Fp8Linear owner(ctx, o), reader(ctx, o);
  const Tensor x = randn({M, K}, 1, 3.0), w = randn({N, K}, 2, 0.1);
  Tensor y = poisoned({M, N});
  for (int step = 1; step <= 2; ++step) {
    const ops::Fp8Input xq = owner.quantize_input(ctx, x);
    owner.forward(ctx, xq, w, y);
    reader.forward(ctx, xq, w, y);
    EXPECT_EQ(owner.x_scaling().next_slot(ctx), step);
    EXPECT_EQ(owner.w_scaling().next_slot(ctx), step);
    EXPECT_EQ(reader.w_scaling().next_slot(ctx), step);
  }
}

// A group layer (model/fp8_layers.h: q|k|v over [3N, K]) is one Fp8Linear over the group's rows,
// with one w and one dy scaling. Where its parts' amaxes are equal its scales are theirs, so its
// y and dW are their products bitwise (column blocks of y, row blocks of dW; each element the same
// dot product), and its dx (one GEMM over 3N) their sum up to rounding; dW by row blocks (the
// overload for gradients that are not back to back) equals its one dW GEMM bitwise.
class Fp8GroupTest : public Fp8LinearTest {
 protected:
  static constexpr int R = 3;
  // Columns [c0, c0 + n) of a [rows, cols] f64 tensor as a contiguous copy.
  Tensor columns(const Tensor& t, std::int64_t c0, std::int64_t n) {
    Tensor out = poisoned({t.dim(0), n});
    for (std::int64_t i = 0; i < t.dim(0); ++i)
      for (std::int64_t j = 0; j < n; ++j)
        out.data_as<double>()[i * n + j] = t.data_as<const double>()[i * t.dim(1) + c0 + j];
    return out;
  }
  // The parts' rows back to back [R N, K].
  Tensor stacked(const std::vector<Tensor>& ws) {
    Tensor all = poisoned({R * N, K});
    for (int i = 0; i < R; ++i)
      std::memcpy(all.data_as<double>() + i * N * K, ws[static_cast<std::size_t>(i)].data_as<const double>(),
                  static_cast<std::size_t>(N * K) * sizeof(double));
    return all;
  }
  // Three weights [N,K] whose amax is `peak` each (one element set; the rest below it).
  std::vector<Tensor> weights(double peak) {
    std::vector<Tensor> ws;
    for (int i = 0; i < R; ++i) {
      ws.push_back(randn({N, K}, 30 + static_cast<std::uint64_t>(i), 0.1));
      ws.back().data_as<double>()[(37 * i + 5) % (N * K)] = peak;
    }
    return ws;
  }
  static float scale_of(const ops::Fp8TensorScaling& s) { return s.scale().data_as<const float>()[0]; }
};

TEST_F(Fp8GroupTest, EqualsItsPartsWhenTheirAmaxesAreEqual) {
  const std::vector<Tensor> ws = weights(0.5);
  const Tensor w = stacked(ws), x = randn({M, K}, 40);
  Tensor dy = randn({M, R * N}, 41);
  for (int i = 0; i < R; ++i) dy.data_as<double>()[(3 + 5 * i) * R * N + i * N + 2] = 5.0;   // equal amax per block
  ops::Fp8Linear group(ctx, {});
  Tensor y = poisoned({M, R * N}), dx = poisoned({M, K}), dw = poisoned({R * N, K});
  const ops::Fp8LinearSaved saved = group.forward(ctx, x, w, y);
  group.backward(ctx, saved, dy, &dx, &dw, false);
  Tensor dx_sum = zeros({M, K});
  for (int i = 0; i < R; ++i) {
    ops::Fp8Linear part(ctx, {});
    Tensor yi = poisoned({M, N}), dxi = poisoned({M, K}), dwi = poisoned({N, K});
    const ops::Fp8LinearSaved si = part.forward(ctx, x, ws[static_cast<std::size_t>(i)], yi);
    part.backward(ctx, si, columns(dy, i * N, N), &dxi, &dwi, false);
    EXPECT_EQ(scale_of(part.w_scaling()), scale_of(group.w_scaling())) << i;
    EXPECT_EQ(scale_of(part.dy_scaling()), scale_of(group.dy_scaling())) << i;
    EXPECT_EQ(values(columns(y, i * N, N)), values(yi)) << "y, part " << i;
    EXPECT_EQ(values(dw.slice(i * N, (i + 1) * N)), values(dwi)) << "dW, part " << i;
    ops::add(ctx, dx_sum, dxi, dx_sum);
  }
  EXPECT_LT(max_rel_diff(dx, dx_sum), 1e-12) << "dx is the sum of the parts' dx";
  // dW by row blocks: bitwise the one GEMM's rows.
  std::vector<Tensor> blocks;
  for (int i = 0; i < R; ++i) blocks.push_back(poisoned({N, K}));
  group.backward(ctx, saved, dy, nullptr, blocks, false);
  for (int i = 0; i < R; ++i)
    EXPECT_EQ(values(blocks[static_cast<std::size_t>(i)]), values(dw.slice(i * N, (i + 1) * N))) << i;
  std::vector<Tensor> short_of_rows{poisoned({N, K})};
  short_of_rows.push_back(poisoned({N, K}));
  EXPECT_THROW(group.backward(ctx, saved, dy, nullptr, short_of_rows, false), Error);
}

TEST_F(Fp8GroupTest, SharesOneScaleTheLargestPartSets) {
  // One part 2^10 larger: the group's w scale is that part's (the max of the amaxes), so the other
  // parts are cast with a scale 2^10 smaller than alone. Power-of-two scales move only exponents:
  // what changes is that their small values fall into e4m3's subnormals (|v| scale < 2^-6), so
  // their y differs from a layer of their own.
  std::vector<Tensor> ws = weights(0.5);
  ops::scale(ctx, ws[2], 1024.0);
  const Tensor x = randn({M, K}, 40);
  ops::Fp8Linear group(ctx, {}), alone0(ctx, {}), alone2(ctx, {});
  Tensor y = poisoned({M, R * N}), y0 = poisoned({M, N}), y2 = poisoned({M, N});
  group.forward(ctx, x, stacked(ws), y);
  alone0.forward(ctx, x, ws[0], y0);
  alone2.forward(ctx, x, ws[2], y2);
  EXPECT_EQ(scale_of(group.w_scaling()), scale_of(alone2.w_scaling()));
  EXPECT_EQ(scale_of(alone0.w_scaling()), 1024 * scale_of(alone2.w_scaling()));
  EXPECT_EQ(values(columns(y, 2 * N, N)), values(y2));
  EXPECT_NE(values(columns(y, 0, N)), values(y0));
}

}  // namespace
}  // namespace lmscale::test
