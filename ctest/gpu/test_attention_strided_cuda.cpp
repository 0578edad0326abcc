// CUDA attention with the model's fused projection layout (docs/architecture.md "fused
// projections"): q, k, v are column blocks of one [B*T, 3*H*Dh] buffer (row stride 3*H*Dh,
// AttentionShape::with_qkv_row_stride) and dq, dk, dv are written into one such buffer, while o
// and dO are [B*T, H*Dh]. Every kernel family must honour the two stride sets: FA2 on tensor cores
// (bf16/fp16, head dims 64, 80, 128), the CUDA-core kernels (fp32, head dim 40), the deterministic
// backward, the Hopper kernels where they can run (head dims 64 and 128), and naive attention.
// Checked against the float64 CPU reference on contiguous copies, with the flash error bounds of
// test_attention_cuda.cpp; the whole dq|dk|dv buffer is compared, so an unwritten (NaN-poisoned)
// or misplaced element fails.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../../src/ops/cpu/attention_cpu.h"
#include "attention_gpu_util.h"
#include "lmscale/ops/ops.h"
#include "lmscale/ops/runtime.h"

namespace {

using lmscale::DType;
using lmscale::Tensor;
using lmscale::ops::AttentionShape;
using namespace attn_test;

double grad_bound(DType d, bool naive) {
  if (d == DType::bf16) return naive ? 6e-2 : 3e-2;
  if (d == DType::f16) return naive ? 1.5e-2 : 5e-3;
  return 1e-4;
}
double out_bound(DType d, bool naive) {
  if (d == DType::bf16) return naive ? 5e-2 : 1.5e-2;
  if (d == DType::f16) return naive ? 1e-2 : 3e-3;
  return 1e-5;
}

struct Case {
  DType dtype;
  int D, T;
  bool causal, deterministic;
};

std::string name(const Case& c) {
  return std::string(lmscale::dtype_name(c.dtype)) + "_d" + std::to_string(c.D) + "_t" + std::to_string(c.T) +
         (c.causal ? "_causal" : "_full") + (c.deterministic ? "_det" : "");
}

// Columns [c0, c0 + cols) of row-major [rows, ld] values, and the reverse.
std::vector<double> columns(const std::vector<double>& x, std::int64_t rows, std::int64_t ld, std::int64_t c0,
                            std::int64_t cols) {
  std::vector<double> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < cols; ++j) out[r * cols + j] = x[r * ld + c0 + j];
  return out;
}
void put_columns(std::vector<double>& x, std::int64_t ld, std::int64_t c0, std::int64_t cols,
                 const std::vector<double>& block) {
  const auto rows = static_cast<std::int64_t>(block.size()) / cols;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < cols; ++j) x[r * ld + c0 + j] = block[r * cols + j];
}

class AttentionStridedCuda : public ::testing::TestWithParam<Case> {
 protected:
  static lmscale::ops::Runtime& rt() {
    static auto* r = new lmscale::ops::Runtime(lmscale::Device::cuda, 0, false);   // never destroyed (exit order)
    return *r;
  }
};

TEST_P(AttentionStridedCuda, QkvColumnBlocksMatchReference) {
  const Case c = GetParam();
  const std::int64_t B = 2, H = 3, T = c.T, D = c.D, dl = H * D, N = B * T, ld = 3 * dl;
  AttentionShape plain = AttentionShape::bthd(B, T, H, D, c.causal);
  AttentionShape s = plain;
  s.with_qkv_row_stride(ld);
  s.deterministic = c.deterministic;
  const auto qkv = random_rounded(N * ld, 91 + D + T, 1, c.dtype), dout = random_rounded(N * dl, 91 + D + T, 2, c.dtype);
  const auto q = columns(qkv, N, ld, 0, dl), k = columns(qkv, N, ld, dl, dl), v = columns(qkv, N, ld, 2 * dl, dl);
  std::vector<double> o_ref(q.size()), l_ref(static_cast<std::size_t>(B * H * T)), dq(q.size()), dk(q.size()),
      dv(q.size());
  lmscale::ops::cpu::attention_flash_forward(plain, q.data(), k.data(), v.data(), o_ref.data(), l_ref.data());
  lmscale::ops::cpu::attention_flash_backward(plain, q.data(), k.data(), v.data(), o_ref.data(), l_ref.data(),
                                              dout.data(), dq.data(), dk.data(), dv.data());
  std::vector<double> dqkv_ref(qkv.size());
  put_columns(dqkv_ref, ld, 0, dl, dq);
  put_columns(dqkv_ref, ld, dl, dl, dk);
  put_columns(dqkv_ref, ld, 2 * dl, dl, dv);

  auto& r = rt();
  auto& ctx = r.ctx();
  auto mk = [&](std::int64_t count, DType d) { return Tensor::empty({count}, d, r.allocator(), "test"); };
  const std::int64_t span = (N - 1) * ld + dl;   // the elements one column block spans
  Tensor tqkv = mk(N * ld, c.dtype), tdo = mk(N * dl, c.dtype), to = mk(N * dl, c.dtype), tl = mk(B * H * T, DType::f32);
  Tensor tdqkv = mk(N * ld, c.dtype);
  upload(qkv, tqkv);
  upload(dout, tdo);
  const Tensor tq = tqkv.flat_range(0, span), tk = tqkv.flat_range(dl, span), tv = tqkv.flat_range(2 * dl, span);
  Tensor tdq = tdqkv.flat_range(0, span), tdk = tdqkv.flat_range(dl, span), tdv = tdqkv.flat_range(2 * dl, span);

  for (Tensor* t : {&to, &tl, &tdqkv}) poison(*t);
  lmscale::ops::attention_flash(ctx, s, tq, tk, tv, to, tl);
  lmscale::ops::attention_flash_backward(ctx, s, tq, tk, tv, to, tl, tdo, tdq, tdk, tdv);
  const double fo = rel_err(download(to), o_ref), fl = rel_err(download(tl), l_ref),
               fg = rel_err(download(tdqkv), dqkv_ref);
  EXPECT_LT(fo, out_bound(c.dtype, false)) << "flash O";
  EXPECT_LT(fl, 1e-5) << "flash lse";
  EXPECT_LT(fg, grad_bound(c.dtype, false)) << "flash dq|dk|dv";

  Tensor probs = mk(B * H * T * T, c.dtype);
  for (Tensor* t : {&to, &probs, &tdqkv}) poison(*t);
  lmscale::ops::attention_naive(ctx, s, tq, tk, tv, to, probs);
  lmscale::ops::attention_naive_backward(ctx, s, tq, tk, tv, probs, tdo, tdq, tdk, tdv);
  const double no = rel_err(download(to), o_ref), ng = rel_err(download(tdqkv), dqkv_ref);
  EXPECT_LT(no, out_bound(c.dtype, true)) << "naive O";
  EXPECT_LT(ng, grad_bound(c.dtype, true)) << "naive dq|dk|dv";
  std::printf("ERR %-28s flash O %.2e L %.2e dqkv %.2e | naive O %.2e dqkv %.2e\n", name(c).c_str(), fo, fl, fg, no,
              ng);
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  for (DType d : {DType::bf16, DType::f16})
    for (int D : {64, 80, 128})
      for (int T : {77, 300})
        for (bool causal : {true, false}) cs.push_back({d, D, T, causal, false});
  for (int D : {64, 80, 128}) cs.push_back({DType::bf16, D, 300, true, true});   // deterministic backward
  for (int T : {17, 130}) cs.push_back({DType::f32, 40, T, true, false});        // CUDA-core kernels
  cs.push_back({DType::f32, 64, 77, false, true});
  return cs;
}

INSTANTIATE_TEST_SUITE_P(All, AttentionStridedCuda, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return name(i.param); });

}  // namespace
