#pragma once
// The local experts of an MoE block (docs/moe.md): each expert's SwiGLU feed-forward over its rows
// of the dispatched tokens. Rows are in expert order: expert e owns rows [r_e, r_e + rows[e]) of
// x, r_e = rows[0] + ... + rows[e-1], Me = the sum of rows. Shapes: x, y, dy, dx [Me,d];
// W1, W3 (and G1, G3) [El,Fe,d]; W2 (and G2) [El,d,Fe]; a, b, g, dg, da, db [Me,Fe]; El =
// rows.size(). All tensors in the compute dtype except the gradients G*, which may be fp32 under
// mixed precision (as ops::linear_backward's dw).
//
// One op for all of them so the model states what it computes, not how. `how` (the deck's
// model.moe_expert_gemm) picks the CUDA form: `loop` runs the experts one after the other as
// cuBLASLt GEMMs; `grouped` runs each projection of all experts as one cuBLAS grouped GEMM
// (ops/cuda/gemm_grouped.h), except products whose output dtype differs from the inputs' (the
// weight gradients into fp32 master gradients), which cuBLAS cannot group: those still loop;
// `wgmma` runs each projection as one call of lmscale's own grouped GEMM for Hopper
// (ops/cuda/grouped_gemm_sm90.h), all products included, and loops on one stream where that
// kernel cannot run (not an sm_90 GPU, fp32 activations, rows not a multiple of 8 elements). CPUs
// always loop (`how` is ignored there). Running the experts side by side on four streams was
// measured slower on an H100 (moe-1b: 105k against 143k tokens/s; docs/moe.md).
#include <cstdint>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"

namespace lmscale::ops {

enum class ExpertGemm { loop, grouped, wgmma };

// Per expert e:  a = x W1[e]^T,  b = x W3[e]^T,  g = silu(a) * b,  y = g W2[e]^T   (all overwritten).
void moe_experts(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows, const Tensor& W1,
                 const Tensor& W3, const Tensor& W2, Tensor& a, Tensor& b, Tensor& g, Tensor& y,
                 ExpertGemm how = ExpertGemm::loop);

// Its backward from dy and the forward's x, a, b, g, per expert e:
//   dg = dy W2[e],  (da, db) = the SwiGLU backward,  dx = da W1[e] + db W3[e]       (overwritten)
//   G2[e] (+)= dy^T g,  G1[e] (+)= da^T x,  G3[e] (+)= db^T x      (accumulate adds, else overwrites)
// An expert with no rows gets zero gradients (unchanged ones when accumulating). dg, da, db are
// the caller's workspace.
void moe_experts_backward(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows, const Tensor& W1,
                          const Tensor& W3, const Tensor& W2, const Tensor& a, const Tensor& b, const Tensor& g,
                          const Tensor& dy, Tensor& dg, Tensor& da, Tensor& db, Tensor& dx, Tensor& G1, Tensor& G3,
                          Tensor& G2, bool accumulate, ExpertGemm how = ExpertGemm::loop);

}  // namespace lmscale::ops
