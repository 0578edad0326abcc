// ops::moe_experts and its backward (ops/moe_experts.h): shape checks, then each expert in turn,
// made of the linear and SwiGLU ops (CPU, and CUDA with ExpertGemm::loop), or on CUDA with
// ExpertGemm::grouped one cuBLAS grouped GEMM per projection (cuda/moe_experts_grouped.cpp), or
// with ExpertGemm::wgmma one call of our own grouped GEMM per projection where it runs
// (cuda/moe_experts_wgmma.cpp), else the loop on one stream.
#include "lmscale/ops/moe_experts.h"

#include <numeric>
#include <optional>

#include "checks.h"
#include "cuda/cuda_ops.h"
#include "expert_products.h"
#ifdef LMSCALE_WITH_CUDA
#include "cuda/gemm_grouped.h"
#include "cuda/gemm_lanes.h"
#endif
#include "lmscale/core/error.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops {
namespace {

// Expert e's matrix of a stacked weight [El, r, c] (a view).
Tensor matrix(const Tensor& t, std::size_t e) { return t.slice(static_cast<std::int64_t>(e), static_cast<std::int64_t>(e) + 1).reshape({t.dim(1), t.dim(2)}); }

void check_experts(const char* op, const Tensor& x, const std::vector<std::int64_t>& rows, const Tensor& W1,
                   const Tensor& W3, const Tensor& W2, const std::vector<detail::NamedTensor>& fe_rows,
                   const std::vector<detail::NamedTensor>& d_rows) {
  const std::int64_t El = static_cast<std::int64_t>(rows.size());
  LMSCALE_CHECK(x.ndim() == 2, "{}: x must be [Me, d], got {}", op, shape_str(x.shape()));
  const std::int64_t Me = x.dim(0), d = x.dim(1);
  for (std::int64_t n : rows) LMSCALE_CHECK(n >= 0, "{}: negative row count {}", op, n);
  LMSCALE_CHECK(std::accumulate(rows.begin(), rows.end(), std::int64_t{0}) == Me,
                "{}: the experts' rows sum to {} but x has {} rows", op,
                std::accumulate(rows.begin(), rows.end(), std::int64_t{0}), Me);
  LMSCALE_CHECK(W1.ndim() == 3 && W1.dim(0) == El && W1.dim(2) == d, "{}: W1 must be [{}, Fe, {}], got {}", op, El, d,
                shape_str(W1.shape()));
  const std::int64_t Fe = W1.dim(1);
  detail::check_shape(op, "W3", W3, {El, Fe, d});
  detail::check_shape(op, "W2", W2, {El, d, Fe});
  for (const auto& [name, t] : fe_rows) detail::check_shape(op, name, *t, {Me, Fe});
  for (const auto& [name, t] : d_rows) detail::check_shape(op, name, *t, {Me, d});
}

// What the loop over the experts sets up on CUDA: the plan cache's shapes-vary mode (an expert's
// row count changes every call, cuda/gemm.h) and two GEMM lanes (cuda/gemm_lanes.h: one expert's
// products beside the next one's; join() before anything reads them), or one for the wgmma
// form's fallback (whose memory has no second lane's workspace). Nothing on CPUs.
class ExpertLoop {
 public:
  ExpertLoop(Context& ctx, const Tensor& x, ExpertGemm how) {
#ifdef LMSCALE_WITH_CUDA
    if (x.device() == Device::cuda) {
      varying_shapes_.emplace(ctx);
      if (how != ExpertGemm::wgmma) lanes_.emplace(ctx);
    }
#else
    (void)ctx, (void)x, (void)how;
#endif
  }
  void use(std::size_t expert) {
#ifdef LMSCALE_WITH_CUDA
    if (lanes_) lanes_->use(expert);
#else
    (void)expert;
#endif
  }
  void join() {
#ifdef LMSCALE_WITH_CUDA
    if (lanes_) lanes_->join();
#endif
  }

 private:
#ifdef LMSCALE_WITH_CUDA
  std::optional<cuda::GemmShapesVary> varying_shapes_;   // declared first: outlives the lanes
  std::optional<cuda::GemmLanes> lanes_;
#endif
};

}  // namespace

void moe_experts(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows, const Tensor& W1,
                 const Tensor& W3, const Tensor& W2, Tensor& a, Tensor& b, Tensor& g, Tensor& y, ExpertGemm how) {
  check_experts("ops::moe_experts", x, rows, W1, W3, W2, {{"a", &a}, {"b", &b}, {"g", &g}}, {{"y", &y}});
#ifdef LMSCALE_WITH_CUDA
  if (how == ExpertGemm::grouped && x.device() == Device::cuda)
    return cuda::moe_experts_grouped(ctx, x, rows, W1, W3, W2, a, b, g, y);
  if (how == ExpertGemm::wgmma && x.device() == Device::cuda &&
      cuda::moe_experts_wgmma_supported(x, {&W1, &W3, &W2, &a, &b, &g, &y}, {}))
    return cuda::moe_experts_wgmma(ctx, x, rows, W1, W3, W2, a, b, g, y);
#endif
  ExpertLoop loop(ctx, x, how);   // CPUs always loop
  // The experts' rows lie back to back in a, b and g, so the SwiGLU runs once over all of them
  // (one launch instead of one per expert: elementwise, the same values).
  const std::vector<std::int64_t> at = detail::expert_row_offsets(rows);
  for (std::size_t e = 0; e < rows.size(); ++e) {
    const std::int64_t r0 = at[e], r1 = at[e + 1];
    if (r1 == r0) continue;
    Tensor ae = a.slice(r0, r1), be = b.slice(r0, r1);
    loop.use(e);
    linear_group(ctx, x.slice(r0, r1), {matrix(W1, e), matrix(W3, e)}, {ae, be});
  }
  loop.join();
  if (x.dim(0) > 0) swiglu(ctx, a, b, g);
  for (std::size_t e = 0; e < rows.size(); ++e) {
    const std::int64_t r0 = at[e], r1 = at[e + 1];
    if (r1 == r0) continue;
    Tensor ye = y.slice(r0, r1);
    loop.use(e);
    linear(ctx, g.slice(r0, r1), matrix(W2, e), ye);
  }
  loop.join();
}

void moe_experts_backward(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows, const Tensor& W1,
                          const Tensor& W3, const Tensor& W2, const Tensor& a, const Tensor& b, const Tensor& g,
                          const Tensor& dy, Tensor& dg, Tensor& da, Tensor& db, Tensor& dx, Tensor& G1, Tensor& G3,
                          Tensor& G2, bool accumulate, ExpertGemm how) {
  constexpr const char* op = "ops::moe_experts_backward";
  check_experts(op, x, rows, W1, W3, W2,
                {{"a", &a}, {"b", &b}, {"g", &g}, {"dg", &dg}, {"da", &da}, {"db", &db}}, {{"dy", &dy}, {"dx", &dx}});
  detail::check_shape(op, "G1", G1, W1.shape());
  detail::check_shape(op, "G3", G3, W3.shape());
  detail::check_shape(op, "G2", G2, W2.shape());
#ifdef LMSCALE_WITH_CUDA
  if (how == ExpertGemm::grouped && x.device() == Device::cuda)
    return cuda::moe_experts_grouped_backward(ctx, x, rows, W1, W3, W2, a, b, g, dy, dg, da, db, dx, G1, G3, G2,
                                              accumulate);
  if (how == ExpertGemm::wgmma && x.device() == Device::cuda &&
      cuda::moe_experts_wgmma_supported(x, {&W1, &W3, &W2, &a, &b, &g, &dy, &dg, &da, &db, &dx}, {&G1, &G3, &G2}))
    return cuda::moe_experts_wgmma_backward(ctx, x, rows, W1, W3, W2, a, b, g, dy, dg, da, db, dx, G1, G3, G2,
                                            accumulate);
#endif
  ExpertLoop loop(ctx, x, how);   // CPUs always loop
  // w2's products for every expert, one SwiGLU backward over all rows (as in the forward), then
  // w1|w3's products: each expert's products are those of the per-expert order, on the same values.
  const std::vector<std::int64_t> at = detail::expert_row_offsets(rows);
  for (std::size_t e = 0; e < rows.size(); ++e) {
    const std::int64_t r0 = at[e], r1 = at[e + 1];
    Tensor g1 = matrix(G1, e), g2 = matrix(G2, e), g3 = matrix(G3, e);
    if (r1 == r0) {
      if (!accumulate)
        for (Tensor* t : {&g1, &g2, &g3}) fill(ctx, *t, 0.0);
      continue;
    }
    Tensor dge = dg.slice(r0, r1);
    loop.use(e);
    linear_backward(ctx, g.slice(r0, r1), matrix(W2, e), dy.slice(r0, r1), &dge, &g2, accumulate);
  }
  loop.join();
  if (x.dim(0) > 0) swiglu_backward(ctx, a, b, dg, da, db);
  for (std::size_t e = 0; e < rows.size(); ++e) {
    const std::int64_t r0 = at[e], r1 = at[e + 1];
    if (r1 == r0) continue;
    Tensor dxe = dx.slice(r0, r1);
    const std::vector<Tensor> g13 = {matrix(G1, e), matrix(G3, e)};
    loop.use(e);
    linear_group_backward(ctx, x.slice(r0, r1), {matrix(W1, e), matrix(W3, e)}, {da.slice(r0, r1), db.slice(r0, r1)},
                          &dxe, &g13, accumulate);
  }
  loop.join();
}

}  // namespace lmscale::ops
