// The MoE experts on grouped GEMMs (ops/moe_experts.h, model.moe_expert_gemm = grouped): each
// projection of all local experts is one detail::expert_products list run by gemm_grouped (one
// cuBLAS grouped GEMM, or the loop where cuBLAS cannot group); the SwiGLU and its backward run
// once over all rows (elementwise, so bitwise the per-expert calls).
//
// The products and their layouts: detail::expert_projection_specs (ops/expert_products.h).
#include "cuda_ops.h"
#include "gemm_grouped.h"
#include "lmscale/core/error.h"
#include "moe_expert_gradients.h"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

using detail::ExpertProductSpec;

void run(Context& ctx, const std::vector<std::int64_t>& rows, const ExpertProductSpec& spec, GroupedOperands o) {
  gemm_grouped(resources(ctx), ctx.allow_tf32, detail::expert_products(rows, spec), o);
}

void check_dtypes(const char* op, DType t, const std::vector<std::pair<const char*, const Tensor*>>& same) {
  for (const auto& [name, ten] : same)
    LMSCALE_CHECK(ten->dtype() == t, "{}: {} is {} but x is {}", op, name, dtype_name(ten->dtype()), dtype_name(t));
}

}  // namespace

void moe_experts_grouped(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows, const Tensor& W1,
                         const Tensor& W3, const Tensor& W2, Tensor& a, Tensor& b, Tensor& g, Tensor& y) {
  const DType t = x.dtype();
  check_dtypes("ops::moe_experts", t, {{"W1", &W1}, {"W3", &W3}, {"W2", &W2}, {"a", &a}, {"b", &b}, {"g", &g}, {"y", &y}});
  if (x.dim(0) == 0) return;
  const detail::ExpertProjectionSpecs s = detail::expert_projection_specs(x.dim(1), W1.dim(1), false);
  run(ctx, rows, s.up, {{W1.data(), W3.data()}, {x.data(), x.data()}, {a.data(), b.data()}, t, t});
  swiglu(ctx, a, b, 1, a.numel(), a.numel(), g, nullptr);   // contiguous: one row
  run(ctx, rows, s.down, {{W2.data()}, {g.data()}, {y.data()}, t, t});
}

void moe_experts_grouped_backward(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows,
                                  const Tensor& W1, const Tensor& W3, const Tensor& W2, const Tensor& a,
                                  const Tensor& b, const Tensor& g, const Tensor& dy, Tensor& dg, Tensor& da,
                                  Tensor& db, Tensor& dx, Tensor& G1, Tensor& G3, Tensor& G2, bool accumulate) {
  constexpr const char* op = "ops::moe_experts_backward";
  const DType t = x.dtype(), gt = G1.dtype();
  check_dtypes(op, t, {{"W1", &W1}, {"W3", &W3}, {"W2", &W2}, {"a", &a}, {"b", &b}, {"g", &g}, {"dy", &dy},
                       {"dg", &dg}, {"da", &da}, {"db", &db}, {"dx", &dx}});
  LMSCALE_CHECK(gt == t || gt == DType::f32, "{}: gradients are {} with {} activations (the same or fp32)", op,
                dtype_name(gt), dtype_name(t));
  LMSCALE_CHECK(G3.dtype() == gt && G2.dtype() == gt, "{}: G1 {}, G3 {}, G2 {} must share a dtype", op,
                dtype_name(gt), dtype_name(G3.dtype()), dtype_name(G2.dtype()));
  const std::int64_t d = x.dim(1), Fe = W1.dim(1);
  // An expert without rows has no products: its gradients are zero (or unchanged).
  if (!accumulate) zero_empty_expert_gradients(ctx, rows, {&G1, &G3, &G2});
  if (x.dim(0) == 0) return;
  detail::ExpertProjectionSpecs s = detail::expert_projection_specs(d, Fe, accumulate);
  run(ctx, rows, s.grad_g, {{W2.data()}, {dy.data()}, {dg.data()}, t, t});
  run(ctx, rows, s.grad_w2, {{g.data()}, {dy.data()}, {G2.data()}, t, gt});
  swiglu_backward(ctx, a, b, 1, a.numel(), a.numel(), dg, da, db, nullptr);
  run(ctx, rows, s.grad_x, {{W1.data()}, {da.data()}, {dx.data()}, t, t});
  s.grad_x.beta = 1.f;   // adds W3[e]' dB_e' in the epilogue: no temporary
  run(ctx, rows, s.grad_x, {{W3.data()}, {db.data()}, {dx.data()}, t, t});
  run(ctx, rows, s.grad_w13, {{x.data(), x.data()}, {da.data(), db.data()}, {G1.data(), G3.data()}, t, gt});
}

}  // namespace lmscale::ops::cuda
