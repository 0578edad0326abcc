// The MoE experts on lmscale's own grouped GEMM for Hopper (model.moe_expert_gemm = wgmma;
// grouped_gemm_sm90.h): each projection of all local experts is one call, its products (one or
// two per expert) in one persistent launch; the SwiGLU and its backward run once over all rows.
//
// Shapes (ops/moe_experts.h): expert e owns rows [r_e, r_e + n_e) of x, y, dy, dx [Me, d] and of
// a, b, g and their gradients [Me, Fe]; W1, W3 [El, Fe, d], W2 [El, d, Fe]. The forward and data
// gradients read each expert's rows from one map of the whole activation (rows past the expert's
// end belong to the next expert and only reach rows of C that are not stored); the weight
// gradients reduce over the rows, so each expert's activations there are a matrix of exactly its
// rows.
#include "../expert_products.h"
#include "alignment.h"
#include "cuda_ops.h"
#include "grouped_gemm_sm90.h"
#include "lmscale/core/error.h"
#include "moe_expert_gradients.h"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

using grouped_sm90::Call;
using grouped_sm90::Layout;
using grouped_sm90::Matrix;
using grouped_sm90::Problem;
using grouped_sm90::Segment;

// A row-major [rows, cols] tensor (or its rows from `row0`) as an operand; a stacked weight
// [El, r, c] as a stack of El matrices.
Matrix rows_of(const Tensor& t, std::int64_t row0, std::int64_t rows) {
  const std::int64_t cols = t.dim(1);
  return {static_cast<const char*>(t.data()) + row0 * cols * static_cast<std::int64_t>(dtype_size(t.dtype())), rows,
          cols, cols, 1, 0};
}
Matrix all_rows(const Tensor& t) { return rows_of(t, 0, t.dim(0)); }
Matrix stack(const Tensor& w) { return {w.data(), w.dim(1), w.dim(2), w.dim(2), w.dim(0), w.dim(1) * w.dim(2)}; }

void* row_ptr(Tensor& t, std::int64_t row) {
  return static_cast<char*>(t.data()) + row * t.dim(1) * static_cast<std::int64_t>(dtype_size(t.dtype()));
}
void* matrix_ptr(Tensor& t, std::int64_t e) {
  return static_cast<char*>(t.data()) + e * t.dim(1) * t.dim(2) * static_cast<std::int64_t>(dtype_size(t.dtype()));
}

Problem problem(std::int64_t m, std::int64_t n, void* c, std::int64_t ldc, Segment s) {
  Problem p;
  p.m = m, p.n = n, p.c = c, p.ldc = ldc;
  p.segments[0] = s;
  return p;
}

void run(Context& ctx, const Call& call) {
  Resources& r = resources(ctx);
  // The SMs the GEMMs may take: parallel.comm_sms leaves some to NCCL (Resources::gemm_sm_target,
  // which the cuBLASLt plans honour too).
  r.grouped_gemm.sm90_launches += grouped_sm90::run(call, r.gemm_sm_target > 0 ? r.gemm_sm_target : r.num_sms, r.stream);
  ++r.grouped_gemm.sm90_calls;
}

}  // namespace

bool moe_experts_wgmma_supported(const Tensor& x, const std::vector<const Tensor*>& same_dtype,
                                 const std::vector<const Tensor*>& gradients) {
  const DType t = x.dtype();
  if ((t != DType::bf16 && t != DType::f16) || !grouped_sm90::available()) return false;
  for (const Tensor* u : same_dtype)
    if (u->dtype() != t || !is_aligned16(u->data()) || u->dim(-1) % 8 != 0) return false;
  // The weight gradients share one dtype (the backward's calls take G1's for all three).
  for (const Tensor* G : gradients)
    if ((G->dtype() != t && G->dtype() != DType::f32) || G->dtype() != gradients.front()->dtype() ||
        !is_aligned16(G->data()) || G->dim(-1) % 8 != 0)
      return false;
  return is_aligned16(x.data()) && x.dim(1) % 8 == 0;
}

void moe_experts_wgmma(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows, const Tensor& W1,
                       const Tensor& W3, const Tensor& W2, Tensor& a, Tensor& b, Tensor& g, Tensor& y) {
  if (x.dim(0) == 0) return;
  const std::int64_t d = x.dim(1), Fe = W1.dim(1);
  const std::vector<std::int64_t> at = detail::expert_row_offsets(rows);
  Call up{Layout::nt, x.dtype(), x.dtype(), false, {all_rows(x)}, {stack(W1), stack(W3)}, {}};
  Call down{Layout::nt, x.dtype(), x.dtype(), false, {all_rows(g)}, {stack(W2)}, {}};
  for (std::size_t e = 0; e < rows.size(); ++e) {
    const std::int64_t n = rows[e], r0 = at[e], ei = static_cast<std::int64_t>(e);
    if (n == 0) continue;
    up.problems.push_back(problem(n, Fe, row_ptr(a, r0), Fe, {0, 0, r0, 0, 0, ei, d}));   // a_e = x_e W1[e]^T
    up.problems.push_back(problem(n, Fe, row_ptr(b, r0), Fe, {0, 1, r0, 0, 0, ei, d}));   // b_e = x_e W3[e]^T
    down.problems.push_back(problem(n, d, row_ptr(y, r0), d, {0, 0, r0, 0, 0, ei, Fe}));  // y_e = g_e W2[e]^T
  }
  run(ctx, up);
  swiglu(ctx, a, b, 1, a.numel(), a.numel(), g, nullptr);   // contiguous: one row
  run(ctx, down);
}

void moe_experts_wgmma_backward(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows, const Tensor& W1,
                                const Tensor& W3, const Tensor& W2, const Tensor& a, const Tensor& b, const Tensor& g,
                                const Tensor& dy, Tensor& dg, Tensor& da, Tensor& db, Tensor& dx, Tensor& G1,
                                Tensor& G3, Tensor& G2, bool accumulate) {
  const DType t = x.dtype(), gt = G1.dtype();
  const std::int64_t d = x.dim(1), Fe = W1.dim(1);
  // An expert without rows has no products: its gradients are zero (or unchanged).
  if (!accumulate) zero_empty_expert_gradients(ctx, rows, {&G1, &G3, &G2});
  if (x.dim(0) == 0) return;
  const std::vector<std::int64_t> at = detail::expert_row_offsets(rows);
  // dg_e = dy_e W2[e];  dx_e = da_e W1[e] + db_e W3[e] (one accumulator, two segments).
  Call grad_g{Layout::nn, t, t, false, {all_rows(dy)}, {stack(W2)}, {}};
  Call grad_x{Layout::nn, t, t, false, {all_rows(da), all_rows(db)}, {stack(W1), stack(W3)}, {}};
  // G2[e] (+)= dy_e^T g_e;  G1[e] (+)= da_e^T x_e,  G3[e] (+)= db_e^T x_e: per-expert matrices.
  Call grad_w2{Layout::tn, t, gt, accumulate, {}, {}, {}};
  Call grad_w13{Layout::tn, t, gt, accumulate, {}, {}, {}};
  for (std::size_t e = 0; e < rows.size(); ++e) {
    const std::int64_t n = rows[e], r0 = at[e], ei = static_cast<std::int64_t>(e);
    if (n == 0) continue;
    grad_g.problems.push_back(problem(n, Fe, row_ptr(dg, r0), Fe, {0, 0, r0, 0, 0, ei, d}));
    Problem px = problem(n, d, row_ptr(dx, r0), d, {0, 0, r0, 0, 0, ei, Fe});
    px.segments[1] = {1, 1, r0, 0, 0, ei, Fe};
    px.segment_count = 2;
    grad_x.problems.push_back(px);

    const int k = static_cast<int>(grad_w2.a.size());
    grad_w2.a.push_back(rows_of(dy, r0, n));
    grad_w2.b.push_back(rows_of(g, r0, n));
    grad_w2.problems.push_back(problem(d, Fe, matrix_ptr(G2, ei), Fe, {k, k, 0, 0, 0, 0, n}));

    const int j = static_cast<int>(grad_w13.b.size());   // x_e, shared by G1 and G3
    grad_w13.b.push_back(rows_of(x, r0, n));
    grad_w13.a.push_back(rows_of(da, r0, n));
    grad_w13.a.push_back(rows_of(db, r0, n));
    grad_w13.problems.push_back(problem(Fe, d, matrix_ptr(G1, ei), d, {2 * j, j, 0, 0, 0, 0, n}));
    grad_w13.problems.push_back(problem(Fe, d, matrix_ptr(G3, ei), d, {2 * j + 1, j, 0, 0, 0, 0, n}));
  }
  run(ctx, grad_g);
  run(ctx, grad_w2);
  swiglu_backward(ctx, a, b, 1, a.numel(), a.numel(), dg, da, db, nullptr);
  run(ctx, grad_x);
  run(ctx, grad_w13);
}

}  // namespace lmscale::ops::cuda
