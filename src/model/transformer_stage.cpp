// The Transformer LM run as one pipeline stage (transformer.h, "Pipeline stages"): the units of
// the ParameterStore's range. Same ops in the same order as forward()/backward() of the whole
// model, so a pipeline over one process's microbatches gives bitwise the same gradients.
#include <functional>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/ops.h"

namespace lmscale::model {

namespace {
void call(const std::function<void(int)>& hook, int unit) {
  if (hook) hook(unit);
}
void notify(const ParallelContext& pc, int i) {
  if (pc.on_grad_ready) pc.on_grad_ready(i);
}
}  // namespace

std::unique_ptr<Activations> TransformerLM::forward_stage(Context& ctx, const Tensor& input, const Tensor& targets,
                                                          std::int64_t B, std::int64_t T, bool keep,
                                                          double grad_scale, const ParallelContext& pc,
                                                          bool accumulate) {
  NvtxRange range("forward_stage");
  // Tensor parallel stages (tp x pp): the blocks are Megatron's, the first stage's embedding and
  // the last stage's head vocabulary-parallel; what crosses a stage boundary is the residual
  // stream as this tp rank holds it: [N,d] replicated, or its row shard [N/tp,d] under sequence
  // parallelism (Nl rows either way).
  const StageUnits& u = units_;
  const std::int64_t N = B * T, Nl = local_rows(N), d = dims_.d_model;
  const int L = static_cast<int>(dims_.layers);
  auto act = std::make_unique<Activations>();
  act->B = B;
  act->T = T;
  act->targets = targets;
  act->accumulate = accumulate;
  act->grad_scale = grad_scale;
  Tensor x;
  if (u.owns_embedding()) {
    LMSCALE_CHECK(input.dtype() == DType::i32 && input.numel() == N, "stage 0 input: tokens int32 [{}, {}], got {}", B,
                  T, shape_str(input.shape()));
    act->tokens = input;
    call(pc.before_forward, 0);
    x = embed(pc, ctx, input.reshape({N}));   // [Nl,d]
    call(pc.after_forward, 0);
  } else {
    LMSCALE_CHECK(input.dtype() == compute_ && input.numel() == Nl * d,
                  "stage input: activations [{}, {}] {}, got {} {}", Nl, d, dtype_name(compute_),
                  shape_str(input.shape()), dtype_name(input.dtype()));
    x = input.reshape({Nl, d});
  }
  x = run_blocks_forward(ctx, *act, x, keep, pc);
  if (!u.owns_head(dims_)) {
    act->output = x;
    return act;
  }
  NvtxRange r("lm_head");
  call(pc.before_forward, L + 1);
  LMSCALE_CHECK(targets.defined() && targets.numel() == N, "the last stage needs targets int32 [{}, {}]", B, T);
  act->loss_sum = Tensor::empty({1}, stats_, *ctx.allocator, "loss");
  const HeadGrad grad{grad_scale, accumulate};
  act->dx_final = head_unit(ctx, x, targets.reshape({N}), act->loss_sum, keep ? &grad : nullptr, pc);
  if (act->moe_loss.defined()) ops::add(ctx, act->loss_sum, act->moe_loss, act->loss_sum);   // router losses
  x = Tensor();
  call(pc.after_forward, L + 1);
  return act;
}

Tensor TransformerLM::backward_stage(Context& ctx, Activations& act, Tensor dy, const ParallelContext& pc,
                                     bool accumulate, bool defer_weights) {
  NvtxRange range("backward_stage");
  act.defer_weights = defer_weights;
  const StageUnits& u = units_;
  const std::int64_t N = act.B * act.T, Nl = local_rows(N), d = dims_.d_model;
  Tensor dx;
  if (u.owns_head(dims_)) {
    // As backward(): the head unit's backward ran in forward_stage; start from its gradient.
    LMSCALE_CHECK(act.dx_final.defined(), "backward_stage needs a forward_stage with keep = true");
    LMSCALE_CHECK(act.accumulate == accumulate, "backward_stage(accumulate = {}) after forward_stage(accumulate = {})",
                  accumulate, act.accumulate);
    dx = act.dx_final;
    act.dx_final = Tensor();
  } else {
    LMSCALE_CHECK(dy.defined() && dy.numel() == Nl * d, "stage backward: output gradient [{}, {}] expected", Nl, d);
    dx = dy.reshape({Nl, d});
  }
  blocks_backward(ctx, act, dx, pc, accumulate);
  if (!u.owns_embedding()) return dx;
  NvtxRange r("embedding_backward");
  call(pc.before_backward, 0);
  const int emb = params_.local_index(0);
  Tensor gEmb = grad_for_adding(ctx, emb, accumulate);
  embed_backward(pc, ctx, act.tokens.reshape({N}), dx, gEmb);   // vocabulary-parallel under tp
  notify(pc, emb);
  call(pc.after_backward, 0);
  return Tensor();
}

}  // namespace lmscale::model
