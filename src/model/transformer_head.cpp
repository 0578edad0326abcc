// The head unit L+1 of the Transformer LM (transformer.h): final RMSNorm, LM head and the
// cross-entropy, fused over row chunks so that the [N,V] logits never exist (at 8B and 32k tokens
// they would be 10 GB in bf16). In a training forward the unit's backward runs here as well: each
// chunk's logits are turned into their gradient in place and used at once for dx and dW_head, so
// nothing is kept for the backward and nothing recomputed (docs/internals.md, "Fused LM head").
// Shapes: x, y, rstd on Nl rows (N/tp under sequence parallelism), y_full [N,d], logits chunk
// [rows, Vl], dy [N,d], dx [Nl,d].
#include <functional>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/ops.h"

namespace lmscale::model {

namespace {
void notify(const ParallelContext& pc, int i) {
  if (pc.on_grad_ready) pc.on_grad_ready(i);
}
void call(const std::function<void(int)>& hook, int unit) {
  if (hook) hook(unit);
}
}  // namespace

Tensor TransformerLM::head_logits(Context& ctx, const Tensor& x, const ParallelContext& pc) {
  const std::int64_t Nl = x.dim(0), d = dims_.d_model;
  const int ln_final = params_.local_index(ParamIndex(dims_).ln_final());   // store index
  Allocator& A = *ctx.allocator;
  Tensor rstd = Tensor::empty({Nl}, stats_, A, "activations");
  Tensor y = Tensor::empty({Nl, d}, compute_, A, "activations");
  ops::rmsnorm(ctx, x, params_.compute_weight(ln_final), dims_.norm_eps, y, rstd);
  Tensor y_full = tp_f(pc, ctx, y);   // [N,d]: the vocabulary-parallel head is column-parallel
  Tensor logits = Tensor::empty({y_full.dim(0), Vl_}, compute_, A, "logits");
  ops::linear(ctx, y_full, params_.compute_weight(params_.local_index(ParamIndex(dims_).lm_head())), logits);
  return logits;
}

Tensor TransformerLM::head_unit(Context& ctx, const Tensor& x, const Tensor& targets, Tensor& loss_sum,
                                const HeadGrad* grad, const ParallelContext& pc) {
  const int L = static_cast<int>(dims_.layers);
  const int ln_final = params_.local_index(ParamIndex(dims_).ln_final()), head = params_.local_index(ParamIndex(dims_).lm_head());
  const std::int64_t Nl = x.dim(0), d = dims_.d_model;
  Allocator& A = *ctx.allocator;
  const Tensor w_norm = params_.compute_weight(ln_final);
  Tensor rstd = Tensor::empty({Nl}, stats_, A, "activations");
  Tensor y = Tensor::empty({Nl, d}, compute_, A, "activations");
  ops::rmsnorm(ctx, x, w_norm, dims_.norm_eps, y, rstd);
  Tensor y_full = tp_f(pc, ctx, y);   // [N,d]: the vocabulary-parallel head is column-parallel
  const std::int64_t N = y_full.dim(0);
  const std::int64_t chunk = dims_.head_chunk_rows(N, Vl_, static_cast<std::int64_t>(dtype_size(compute_)));
  const Tensor w = params_.compute_weight(head);
  if (!grad) {
    if (!tp_.active()) ops::linear_cross_entropy(ctx, y_full, w, targets, loss_sum, nullptr, nullptr, false, 1.0, chunk);
    else head_chunks_tp(pc, ctx, y_full, w, targets, loss_sum, nullptr, nullptr, nullptr, chunk);
    return Tensor();
  }
  // The unit's backward, from the same chunks (its hooks as backward() calls them for a block).
  NvtxRange r("lm_head_backward");
  call(pc.before_backward, L + 1);
  Tensor dy = Tensor::empty({N, d}, compute_, A, "activation_grads");
  Tensor g_head = params_.grad(head);
  if (!tp_.active()) {
    ops::linear_cross_entropy(ctx, y_full, w, targets, loss_sum, &dy, &g_head, grad->accumulate, grad->scale, chunk);
  } else {
    dy = head_chunks_tp(pc, ctx, y_full, w, targets, loss_sum, &dy, &g_head, grad, chunk);   // summed: [Nl,d]
  }
  notify(pc, head);
  y_full = Tensor();
  y = Tensor();
  Tensor dx = Tensor::empty({Nl, d}, compute_, A, "activation_grads");
  Tensor g_norm = grad_for_adding(ctx, ln_final, grad->accumulate);
  norm_backward(pc, ctx, x, w_norm, rstd, dy, dx, g_norm);
  notify(pc, ln_final);
  call(pc.after_backward, L + 1);
  return dx;
}

}  // namespace lmscale::model
