#pragma once
// The MoE experts' matrix products as one list (ops/moe_experts.h, model.moe_expert_gemm =
// grouped): for every expert with rows and every copy j of its product (w1 and w3 of one
// expert: 2 copies), one column-major product C = alpha op(A) op(B) + beta C whose operands start
// at element offsets from the copy's base pointers, grouped the way cuBLAS's grouped GEMM takes
// them: consecutive problems with identical dimensions form one group. Host-side only (no device
// memory, testable on any build); ops/cuda/gemm_grouped.cpp turns the offsets into pointers.
//
// Experts own rows [r_e, r_e + rows[e]) of the row-major activations (r_e the prefix sum of the
// rows before e); their weights are matrices e of a stacked [El, r, c] tensor.
#include <cstdint>
#include <vector>

namespace lmscale::ops::detail {

// One dimension of an expert's product: a fixed size, or the expert's row count.
struct ExpertDim {
  std::int64_t fixed = 0;
  bool rows = false;
  std::int64_t of(std::int64_t expert_rows) const { return rows ? expert_rows : fixed; }
};
inline ExpertDim fixed_dim(std::int64_t n) { return {n, false}; }
inline ExpertDim rows_dim() { return {0, true}; }

// Where an operand of expert e starts, in elements from its copy's base: per_expert * e +
// per_row * r_e (a stacked weight: per_expert = its matrix size; activations: per_row = the row
// length).
struct ExpertOperand {
  std::int64_t per_expert = 0, per_row = 0;
  std::int64_t offset(std::int64_t e, std::int64_t first_row) const { return per_expert * e + per_row * first_row; }
};

struct ExpertProductSpec {
  bool trans_a = false, trans_b = false;
  ExpertDim m, n, k;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  ExpertOperand a, b, c;
  int copies = 1;
  float alpha = 1.f, beta = 0.f;
};

// The products of a spec over the experts' rows. Experts with no rows have none (their output,
// a weight gradient, is the caller's to zero). Problems are expert-major, then copy; a group is
// a run of problems whose m, n, k agree (equal row counts of consecutive experts merge).
struct GroupedProducts {
  struct Group {
    std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
    int size = 0;   // problems in the group
  };
  struct Problem {
    std::int64_t expert = 0;
    int copy = 0;
    std::int64_t a = 0, b = 0, c = 0;   // element offsets from the copy's bases
  };
  bool trans_a = false, trans_b = false;
  float alpha = 1.f, beta = 0.f;
  std::vector<Group> groups;
  std::vector<Problem> problems;   // group-major: group 0's problems first
};

GroupedProducts expert_products(const std::vector<std::int64_t>& rows, const ExpertProductSpec& spec);

// The experts' first rows r_e (above): at[e] = rows[0] + ... + rows[e-1], and at[El] the rows of
// all (El + 1 entries), for the forms that address each expert's rows themselves.
std::vector<std::int64_t> expert_row_offsets(const std::vector<std::int64_t>& rows);

// The specs of ops::moe_experts and its backward for d = d_model, Fe = the experts' inner size.
// Row-major tensors read as column-major matrices are their transposes: for expert e with rows
// [r_e, r_e + n_e), X_e' (d x n_e, ld d), A_e', B_e', G_e' and their gradients (Fe x n_e, ld Fe),
// dY_e' (d x n_e, ld d), W1[e]' and W3[e]' (d x Fe, ld d), W2[e]' (Fe x d, ld Fe). Operands in
// the order (A, B, C) of each product.
struct ExpertProjectionSpecs {
  ExpertProductSpec up;         // a_e^T = W1[e]'^T X_e', b_e^T = W3[e]'^T X_e'  (copies: w1, w3)
  ExpertProductSpec down;       // y_e^T = W2[e]'^T G_e'
  ExpertProductSpec grad_g;     // dg_e^T = W2[e]' dY_e'
  ExpertProductSpec grad_w2;    // G2[e]^T (+)= G_e' dY_e'^T
  ExpertProductSpec grad_x;     // dx_e^T = W1[e]' dA_e' (beta 0), then += W3[e]' dB_e' (beta 1)
  ExpertProductSpec grad_w13;   // G1[e]^T (+)= X_e' dA_e'^T, G3[e]^T (+)= X_e' dB_e'^T  (copies: w1, w3)
};
// beta of the weight gradients: 1 when accumulating, else 0.
ExpertProjectionSpecs expert_projection_specs(std::int64_t d, std::int64_t Fe, bool accumulate);

}  // namespace lmscale::ops::detail
