#pragma once
// The local experts of an MoE block (docs/moe.md): each expert's SwiGLU feed-forward over its rows
// of the dispatched tokens. Rows are in expert order: expert e owns rows [r_e, r_e + rows[e]) of
// x, r_e = rows[0] + ... + rows[e-1], Me = the sum of rows. Shapes: x, y, dy, dx [Me,d];
// W1, W3 (and G1, G3) [El,Fe,d]; W2 (and G2) [El,d,Fe]; a, b, g, dg, da, db [Me,Fe]; El =
// rows.size(). All tensors in the compute dtype except the gradients G*, which may be fp32 under
// mixed precision (as ops::linear_backward's dw).
//
// One op for all of them so the model states what it computes, not how: the experts run one after
// the other as cuBLASLt GEMMs today. Running them side by side on four streams was measured slower
// on an H100 (moe-1b: 105k against 143k tokens/s; docs/moe.md), so a faster form is a grouped
// GEMM behind this interface, not concurrency.
#include <cstdint>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"

namespace lmscale::ops {

// Per expert e:  a = x W1[e]^T,  b = x W3[e]^T,  g = silu(a) * b,  y = g W2[e]^T   (all overwritten).
void moe_experts(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows, const Tensor& W1,
                 const Tensor& W3, const Tensor& W2, Tensor& a, Tensor& b, Tensor& g, Tensor& y);

// Its backward from dy and the forward's x, a, b, g, per expert e:
//   dg = dy W2[e],  (da, db) = the SwiGLU backward,  dx = da W1[e] + db W3[e]       (overwritten)
//   G2[e] (+)= dy^T g,  G1[e] (+)= da^T x,  G3[e] (+)= db^T x      (accumulate adds, else overwrites)
// An expert with no rows gets zero gradients (unchanged ones when accumulating). dg, da, db are
// the caller's workspace (the lanes may not allocate: ops/lanes.h).
void moe_experts_backward(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows, const Tensor& W1,
                          const Tensor& W3, const Tensor& W2, const Tensor& a, const Tensor& b, const Tensor& g,
                          const Tensor& dy, Tensor& dg, Tensor& da, Tensor& db, Tensor& dx, Tensor& G1, Tensor& G3,
                          Tensor& G2, bool accumulate);

}  // namespace lmscale::ops
