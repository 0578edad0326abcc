// detail::expert_products (expert_products.h): the experts' products, grouped by their dimensions.
#include "expert_products.h"

#include <numeric>

#include "lmscale/core/error.h"

namespace lmscale::ops::detail {

GroupedProducts expert_products(const std::vector<std::int64_t>& rows, const ExpertProductSpec& spec) {
  LMSCALE_CHECK(spec.copies >= 1, "expert_products: {} copies", spec.copies);
  LMSCALE_CHECK(spec.m.rows || spec.n.rows || spec.k.rows, "expert_products: no dimension is the expert's rows");
  GroupedProducts p;
  p.trans_a = spec.trans_a, p.trans_b = spec.trans_b, p.alpha = spec.alpha, p.beta = spec.beta;
  std::int64_t first_row = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto e = static_cast<std::int64_t>(i);
    const std::int64_t r = rows[i];
    LMSCALE_CHECK(r >= 0, "expert_products: expert {} has {} rows", e, r);
    if (r > 0) {
      const GroupedProducts::Group dims{spec.m.of(r), spec.n.of(r), spec.k.of(r), spec.lda, spec.ldb, spec.ldc, 0};
      if (p.groups.empty() || p.groups.back().m != dims.m || p.groups.back().n != dims.n ||
          p.groups.back().k != dims.k)
        p.groups.push_back(dims);
      for (int j = 0; j < spec.copies; ++j) {
        p.problems.push_back({e, j, spec.a.offset(e, first_row), spec.b.offset(e, first_row), spec.c.offset(e, first_row)});
        ++p.groups.back().size;
      }
    }
    first_row += r;
  }
  return p;
}

std::vector<std::int64_t> expert_row_offsets(const std::vector<std::int64_t>& rows) {
  std::vector<std::int64_t> at(rows.size() + 1, 0);
  std::partial_sum(rows.begin(), rows.end(), at.begin() + 1);
  return at;
}

namespace {

// Products writing [n_e, cols] rows of an activation: C_e^T (cols x n_e) = op(W[e]') B_e', with
// W[e] matrix e of a stacked weight of cols x k elements (trans_a: read transposed) and B_e' the
// expert's rows of an activation of row length k.
ExpertProductSpec rows_out(bool trans_a, std::int64_t cols, std::int64_t k, std::int64_t lda, int copies) {
  ExpertProductSpec s;
  s.trans_a = trans_a;
  s.m = fixed_dim(cols), s.n = rows_dim(), s.k = fixed_dim(k);
  s.lda = lda, s.ldb = k, s.ldc = cols;
  s.a = {cols * k, 0}, s.b = {0, k}, s.c = {0, cols};
  s.copies = copies;
  return s;
}

// A weight gradient W[e]^T (m x n) (+)= A_e' B_e'^T summed over the expert's rows (k = n_e): A_e'
// its rows of length m, B_e' its rows of length n.
ExpertProductSpec weight_grad(std::int64_t m, std::int64_t n, int copies, bool accumulate) {
  ExpertProductSpec s;
  s.trans_b = true;
  s.m = fixed_dim(m), s.n = fixed_dim(n), s.k = rows_dim();
  s.lda = m, s.ldb = n, s.ldc = m;
  s.a = {0, m}, s.b = {0, n}, s.c = {m * n, 0};
  s.copies = copies;
  s.beta = accumulate ? 1.f : 0.f;
  return s;
}

}  // namespace

ExpertProjectionSpecs expert_projection_specs(std::int64_t d, std::int64_t Fe, bool accumulate) {
  ExpertProjectionSpecs s;
  s.up = rows_out(true, Fe, d, d, 2);
  s.down = rows_out(true, d, Fe, Fe, 1);
  s.grad_g = rows_out(false, Fe, d, Fe, 1);
  s.grad_w2 = weight_grad(Fe, d, 1, accumulate);
  s.grad_x = rows_out(false, d, Fe, d, 1);
  s.grad_w13 = weight_grad(d, Fe, 2, accumulate);
  return s;
}

}  // namespace lmscale::ops::detail
