// The fused projection layouts (docs/architecture.md "fused projections") on the CPU: the ops that
// read column blocks of side-by-side rows give what their contiguous forms give on copies of the
// blocks. linear_side_by_side (one GEMM over back-to-back weights, or per-weight products when
// they are not) against linear / linear_group_backward; swiglu_rows, rope with a row stride and
// attention with q/k/v row strides bitwise against the contiguous ops (same arithmetic per
// element), with the columns outside the blocks left untouched.
#include <gtest/gtest.h>

#include <cstring>

#include "lmscale/core/error.h"
#include "ops_test_util.h"

namespace lmscale::test {
namespace {

// Columns [c0, c0 + cols) of a [rows, ld] tensor: the flat view of the elements they span (what
// the strided ops take), and a contiguous [rows, cols] copy.
Tensor block_view(const Tensor& t, std::int64_t c0, std::int64_t cols) {
  return t.flat_range(c0, (t.dim(0) - 1) * t.dim(1) + cols);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

class Blocks : public OpsTest {
 protected:
  Tensor copy_block(const Tensor& t, std::int64_t c0, std::int64_t cols) {
    Tensor out = Tensor::empty({t.dim(0), cols}, t.dtype(), alloc, "test");
    const std::size_t es = dtype_size(t.dtype());
    const auto* src = static_cast<const char*>(t.data());
    for (std::int64_t r = 0; r < t.dim(0); ++r)
      std::memcpy(static_cast<char*>(out.data()) + r * cols * es, src + (r * t.dim(1) + c0) * es, cols * es);
    return out;
  }
  // Attention with q, k, v (and dq, dk, dv) column blocks of [N, 3*dl] rows and o, dO [N, dl].
  void attention_case(bool flash) {
    const std::int64_t B = 2, T = 7, H = 2, Dh = 4, dl = H * Dh, N = B * T;
    Tensor qkv = randn({N, 3 * dl}, 12), dO = randn({N, dl}, 13);
    Tensor q = copy_block(qkv, 0, dl), k = copy_block(qkv, dl, dl), v = copy_block(qkv, 2 * dl, dl);
    const auto plain = ops::AttentionShape::bthd(B, T, H, Dh, true);
    auto strided = ops::AttentionShape::bthd(B, T, H, Dh, true);
    strided.with_qkv_row_stride(3 * dl);
    Tensor o_ref = poisoned({N, dl}), o = poisoned({N, dl});
    Tensor dq = poisoned({N, dl}), dk = poisoned({N, dl}), dv = poisoned({N, dl});
    Tensor dqkv = poisoned({N, 3 * dl});
    Tensor dqs = block_view(dqkv, 0, dl), dks = block_view(dqkv, dl, dl), dvs = block_view(dqkv, 2 * dl, dl);
    const Tensor qs = block_view(qkv, 0, dl), ks = block_view(qkv, dl, dl), vs = block_view(qkv, 2 * dl, dl);
    if (flash) {
      Tensor lse_ref = poisoned({B, H, T}), lse = poisoned({B, H, T});
      ops::attention_flash(ctx, plain, q, k, v, o_ref, lse_ref);
      ops::attention_flash(ctx, strided, qs, ks, vs, o, lse);
      EXPECT_TRUE(bitwise_equal(lse, lse_ref));
      ops::attention_flash_backward(ctx, plain, q, k, v, o_ref, lse_ref, dO, dq, dk, dv);
      ops::attention_flash_backward(ctx, strided, qs, ks, vs, o, lse, dO, dqs, dks, dvs);
    } else {
      Tensor p_ref = poisoned({B, H, T, T}), p = poisoned({B, H, T, T});
      ops::attention_naive(ctx, plain, q, k, v, o_ref, p_ref);
      ops::attention_naive(ctx, strided, qs, ks, vs, o, p);
      EXPECT_TRUE(bitwise_equal(p, p_ref));
      ops::attention_naive_backward(ctx, plain, q, k, v, p_ref, dO, dq, dk, dv);
      ops::attention_naive_backward(ctx, strided, qs, ks, vs, p, dO, dqs, dks, dvs);
    }
    EXPECT_TRUE(bitwise_equal(o, o_ref));
    EXPECT_TRUE(bitwise_equal(copy_block(dqkv, 0, dl), dq));
    EXPECT_TRUE(bitwise_equal(copy_block(dqkv, dl, dl), dk));
    EXPECT_TRUE(bitwise_equal(copy_block(dqkv, 2 * dl, dl), dv));
    // q with the plain shape's extent is too short for the strided layout.
    Tensor lse = poisoned({B, H, T});
    EXPECT_THROW(ops::attention_flash(ctx, strided, q, k, v, o, lse), Error);
  }
};

// Three [R,K] weights back to back in one [3R,K] buffer, as the parameter store holds q, k, v.
std::vector<Tensor> rows_of(const Tensor& w, std::int64_t n) {
  std::vector<Tensor> ws;
  const std::int64_t R = w.dim(0) / n;
  for (std::int64_t i = 0; i < n; ++i) ws.push_back(w.slice(i * R, (i + 1) * R));
  return ws;
}

TEST_F(Blocks, LinearSideBySideIsEachLinearInItsColumns) {
  const std::int64_t M = 7, K = 5, R = 4;
  Tensor x = randn({M, K}, 1), w = randn({3 * R, K}, 2);
  const std::vector<Tensor> adjacent = rows_of(w, 3);
  const std::vector<Tensor> apart = {clone(adjacent[0]), clone(adjacent[1]), clone(adjacent[2])};   // separate
  for (const auto* ws : {&adjacent, &apart}) {
    Tensor y = poisoned({M, 3 * R});
    ops::linear_side_by_side(ctx, x, *ws, y);
    for (std::int64_t i = 0; i < 3; ++i) {
      Tensor yi = poisoned({M, R});
      ops::linear(ctx, x, (*ws)[static_cast<std::size_t>(i)], yi);
      EXPECT_LT(max_rel_diff(copy_block(y, i * R, R), yi), 1e-14) << "block " << i;
    }
  }
}

TEST_F(Blocks, LinearSideBySideBackwardMatchesTheGroupBackward) {
  const std::int64_t M = 9, K = 6, R = 4;
  Tensor x = randn({M, K}, 3), w = randn({3 * R, K}, 4), dy = randn({M, 3 * R}, 5);
  const std::vector<Tensor> ws = rows_of(w, 3);
  const std::vector<Tensor> dys = {copy_block(dy, 0, R), copy_block(dy, R, R), copy_block(dy, 2 * R, R)};
  // The reference: three products, dx summed, dws overwritten then accumulated once more.
  Tensor dx_ref = poisoned({M, K}), g_ref = zeros({3 * R, K});
  std::vector<Tensor> gs_ref = rows_of(g_ref, 3);
  ops::linear_group_backward(ctx, x, ws, dys, &dx_ref, &gs_ref, false);
  ops::linear_group_backward(ctx, x, ws, dys, nullptr, &gs_ref, true);
  // Back-to-back weights and gradients (one GEMM each way), then separate ones (the fallback).
  for (bool adjacent : {true, false}) {
    Tensor g = zeros({3 * R, K});
    std::vector<Tensor> gs = rows_of(g, 3), wsx = ws;
    if (!adjacent) {
      gs = {zeros({R, K}), zeros({R, K}), zeros({R, K})};
      wsx = {clone(ws[0]), clone(ws[1]), clone(ws[2])};
    }
    Tensor dx = poisoned({M, K});
    ops::linear_side_by_side_backward(ctx, x, wsx, dy, &dx, &gs, false);
    ops::linear_side_by_side_backward(ctx, x, wsx, dy, nullptr, &gs, true);   // accumulates
    EXPECT_LT(max_rel_diff(dx, dx_ref), 1e-14) << "adjacent " << adjacent;
    if (!adjacent) EXPECT_TRUE(bitwise_equal(dx, dx_ref)) << "the fallback is the group's arithmetic";
    for (std::size_t i = 0; i < 3; ++i) EXPECT_LT(max_rel_diff(gs[i], gs_ref[i]), 1e-14) << "adjacent " << adjacent;
  }
}

// Context::linear_products counts what the ops dispatch: back-to-back weights (and gradients)
// one product per pass, separate ones one per weight (on the CPU as on GPUs: the model's gradient
// layouts keep a group's gradients back to back, parallel/grad_buckets.h).
TEST_F(Blocks, LinearSideBySideCountsItsProducts) {
  const std::int64_t M = 5, K = 4, R = 3;
  Tensor x = randn({M, K}, 1), w = randn({3 * R, K}, 2), dy = randn({M, 3 * R}, 3);
  const std::vector<Tensor> adjacent = rows_of(w, 3);
  const std::vector<Tensor> apart = {clone(adjacent[0]), clone(adjacent[1]), clone(adjacent[2])};
  for (const auto* ws : {&adjacent, &apart}) {
    const std::int64_t n = ws == &adjacent ? 1 : 3;
    Tensor g = zeros({3 * R, K});
    std::vector<Tensor> gs = rows_of(g, 3);
    Tensor y = poisoned({M, 3 * R}), dx = poisoned({M, K});
    LinearProductCounts c;
    ctx.linear_products = &c;
    ops::linear_side_by_side(ctx, x, *ws, y);
    ops::linear_side_by_side_backward(ctx, x, *ws, dy, &dx, &gs, false);
    ctx.linear_products = nullptr;
    EXPECT_EQ(c.forward, n);
    EXPECT_EQ(c.data_grad, n);
    EXPECT_EQ(c.weight_grad, n);
  }
}

TEST_F(Blocks, LinearSideBySideChecksShapes) {
  Tensor x = randn({4, 3}, 6), w = randn({6, 3}, 7);
  Tensor y_bad = poisoned({4, 5}), dy_bad = randn({4, 4}, 8), dx = poisoned({4, 3});
  EXPECT_THROW(ops::linear_side_by_side(ctx, x, rows_of(w, 3), y_bad), Error);
  EXPECT_THROW(ops::linear_side_by_side_backward(ctx, x, rows_of(w, 3), dy_bad, &dx, nullptr, false), Error);
  const std::vector<Tensor> mixed = {w.slice(0, 2), w.slice(2, 5)};   // shapes differ
  Tensor y = poisoned({4, 5});
  EXPECT_THROW(ops::linear_side_by_side(ctx, x, mixed, y), Error);
}

TEST_F(Blocks, SwigluRowsIsBitwiseTheContiguousOp) {
  const std::int64_t N = 6, F = 5;
  Tensor ab = randn({N, 2 * F}, 9, 2.0), dh = randn({N, F}, 10);
  Tensor a = copy_block(ab, 0, F), b = copy_block(ab, F, F);
  Tensor h_ref = poisoned({N, F}), da_ref = poisoned({N, F}), db_ref = poisoned({N, F});
  ops::swiglu(ctx, a, b, h_ref);
  ops::swiglu_backward(ctx, a, b, dh, da_ref, db_ref);
  Tensor h = poisoned({N, F}), dab = poisoned({N, 2 * F});
  ops::swiglu_rows(ctx, block_view(ab, 0, F), block_view(ab, F, F), N, F, 2 * F, h);
  Tensor da = block_view(dab, 0, F), db = block_view(dab, F, F);
  ops::swiglu_rows_backward(ctx, block_view(ab, 0, F), block_view(ab, F, F), N, F, 2 * F, dh, da, db);
  EXPECT_TRUE(bitwise_equal(h, h_ref));
  EXPECT_TRUE(bitwise_equal(copy_block(dab, 0, F), da_ref));
  EXPECT_TRUE(bitwise_equal(copy_block(dab, F, F), db_ref));
  // Too short a view for the rows it must span.
  EXPECT_THROW(ops::swiglu_rows(ctx, ab.flat_range(0, 5 * 2 * F), block_view(ab, F, F), N, F, 2 * F, h), Error);
}

TEST_F(Blocks, RopeWithRowStrideRotatesOnlyItsHeads) {
  // q|k|v rows [B*T, 3*H*Dh]: rotating the first 2H heads of every row is RoPE on q and on k; v
  // stays as it was.
  const std::int64_t B = 2, T = 5, H = 2, Dh = 4, dl = H * Dh;
  Tensor qkv = randn({B * T, 3 * dl}, 11);
  Tensor q = copy_block(qkv, 0, dl), k = copy_block(qkv, dl, dl), v = copy_block(qkv, 2 * dl, dl);
  ops::rope(ctx, q, B, T, H, Dh, 10000.0, false);
  ops::rope(ctx, k, B, T, H, Dh, 10000.0, false);
  Tensor qk = block_view(qkv, 0, 2 * dl);
  ops::rope(ctx, qk, B, T, 2 * H, Dh, 10000.0, false, 3 * dl);
  EXPECT_TRUE(bitwise_equal(copy_block(qkv, 0, dl), q));
  EXPECT_TRUE(bitwise_equal(copy_block(qkv, dl, dl), k));
  EXPECT_TRUE(bitwise_equal(copy_block(qkv, 2 * dl, dl), v));
  Tensor short_view = qkv.flat_range(0, 3 * dl);
  EXPECT_THROW(ops::rope(ctx, short_view, B, T, 2 * H, Dh, 10000.0, false, 3 * dl), Error);
}

TEST_F(Blocks, NaiveAttentionWithQkvRowStrideIsBitwiseTheContiguousOp) { attention_case(false); }
TEST_F(Blocks, FlashAttentionWithQkvRowStrideIsBitwiseTheContiguousOp) { attention_case(true); }

TEST_F(Blocks, QkvRowStrideNeedsABthdShape) {
  auto s = ops::AttentionShape::bhtd(1, 2, 3, 4);
  EXPECT_THROW(s.with_qkv_row_stride(24), Error);
  auto t = ops::AttentionShape::bthd(1, 3, 2, 4);
  EXPECT_THROW(t.with_qkv_row_stride(4), Error);   // below H*Dh
}

}  // namespace
}  // namespace lmscale::test
