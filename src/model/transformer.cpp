#include "lmscale/model/transformer.h"

#include <algorithm>
#include <functional>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/ops/moe.h"
#include "lmscale/ops/ops.h"

namespace lmscale::model {

namespace {
void notify(const ParallelContext& pc, int i) {
  if (pc.on_grad_ready) pc.on_grad_ready(i);
}
void call(const std::function<void(int)>& hook, int unit) {
  if (hook) hook(unit);
}
bool present(const Tensor& t) { return t.defined() && t.numel() > 0; }
// Columns [col0, col0 + cols) of a [rows, ld] tensor as the flat view of the elements they span:
// (rows - 1)*ld + cols, starting at element col0 (the ops taking a row stride read it so).
Tensor column_block(const Tensor& t, std::int64_t col0, std::int64_t cols) {
  return t.flat_range(col0, (t.dim(0) - 1) * t.dim(1) + cols);
}
}  // namespace

TransformerLM::TransformerLM(const ModelDims& dims, ParameterStore& params)
    : TransformerLM(dims, params, params.units()) {}

TransformerLM::TransformerLM(const ModelDims& dims, ParameterStore& params, StageUnits units)
    : dims_(dims), params_(params), compute_(params.lowp_dtype()),
      stats_(params.master_dtype() == DType::f64 ? DType::f64 : DType::f32), units_(units),
      tp_(params.tensor_split()), ep_(params.expert_split()) {
  LMSCALE_CHECK(dims.d_model % dims.heads == 0 && dims.head_dim() % 2 == 0, "d_model {} / heads {}", dims.d_model,
                dims.heads);
  Hl_ = tp_.local(dims.heads);
  dl_ = Hl_ * dims.head_dim();
  Fl_ = tp_.local(dims.d_ff);
  Vl_ = tp_.local(dims.vocab);
  reset_moe_stats();
}

std::unique_ptr<Activations> TransformerLM::forward(Context& ctx, const Tensor& tokens, const Tensor& targets,
                                                    bool keep, double grad_scale, const ParallelContext& pc,
                                                    bool accumulate) {
  NvtxRange range("forward");
  LMSCALE_CHECK(units_.is_all(dims_), "forward(): a pipeline stage's model runs forward_stage()");
  LMSCALE_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::i32, "tokens must be int32 [B,T], got {}",
                shape_str(tokens.shape()));
  auto act = std::make_unique<Activations>();
  act->B = tokens.dim(0);
  act->T = tokens.dim(1);
  LMSCALE_CHECK(act->T <= dims_.context, "sequence length {} exceeds model.context_length {}", act->T, dims_.context);
  const std::int64_t N = act->B * act->T;
  LMSCALE_CHECK(targets.defined() && targets.dtype() == DType::i32 && targets.numel() == N,
                "forward() needs targets int32 [{}, {}] (logits() gives the logits without a loss)", act->B, act->T);
  act->tokens = tokens;
  act->targets = targets;
  act->accumulate = accumulate;
  act->grad_scale = grad_scale;
  const int head_unit_index = static_cast<int>(dims_.layers) + 1;

  Tensor x;
  {
    NvtxRange r("embedding");
    call(pc.before_forward, 0);
    x = embed(pc, ctx, tokens.reshape({N}));
    call(pc.after_forward, 0);
  }
  x = run_blocks_forward(ctx, *act, x, keep, pc);

  NvtxRange r("lm_head");
  call(pc.before_forward, head_unit_index);
  act->loss_sum = Tensor::empty({1}, stats_, *ctx.allocator, "loss");
  const HeadGrad grad{grad_scale, accumulate};
  act->dx_final = head_unit(ctx, x, targets.reshape({N}), act->loss_sum, keep ? &grad : nullptr, pc);
  if (act->moe_loss.defined()) ops::add(ctx, act->loss_sum, act->moe_loss, act->loss_sum);   // router losses
  x = Tensor();   // the last block's output: its gradient (dx_final) is all the backward needs
  call(pc.after_forward, head_unit_index);
  return act;
}

Tensor TransformerLM::logits(Context& ctx, const Tensor& tokens, const ParallelContext& pc) {
  const std::int64_t N = tokens.numel();
  Activations act;
  act.B = tokens.dim(0);
  act.T = tokens.dim(1);
  call(pc.before_forward, 0);
  Tensor x = embed(pc, ctx, tokens.reshape({N}));
  call(pc.after_forward, 0);
  x = run_blocks_forward(ctx, act, x, false, pc);
  const int head_unit_index = static_cast<int>(dims_.layers) + 1;
  call(pc.before_forward, head_unit_index);
  Tensor out = head_logits(ctx, x, pc);
  call(pc.after_forward, head_unit_index);
  return out;
}

Tensor TransformerLM::run_blocks_forward(Context& ctx, Activations& act, Tensor x, bool keep,
                                         const ParallelContext& pc) {
  const int L = static_cast<int>(dims_.layers);
  // The blocks this store holds: all of them, or a pipeline stage's range [l0, l1). Saved
  // activations stay indexed by global layer (entries outside the range stay empty).
  const int l0 = units_.first_layer(), l1 = units_.end_layer(dims_);
  act.blocks.assign(keep ? static_cast<std::size_t>(L) : 0, BlockActivations{});
  if (dims_.moe()) {   // the MoE blocks' router losses, added to the loss sum after the head
    act.moe_loss = Tensor::empty({1}, stats_, *ctx.allocator, "loss");
    ops::fill(ctx, act.moe_loss, 0.0);
  }
  if (keep && recompute_.mode == RecomputePolicy::Mode::every_k)
    act.group_inputs.assign(static_cast<std::size_t>(recompute_.group_of(L - 1) + 1), Tensor());
  for (int l = l0; l < l1; ++l) {
    NvtxRange r("layer");
    call(pc.before_forward, l + 1);
    // What this block keeps for its backward: the policy answers per block (recompute.h); an
    // evaluation forward (keep = false) keeps nothing.
    const BlockKeep k = keep ? recompute_.block(l, l0, l1, dims_.flash) : BlockKeep{};
    if (k.group_input) act.group_inputs[static_cast<std::size_t>(recompute_.group_of(l))] = x;
    BlockActivations scratch;   // without `keep` (or recomputed) the block's saved tensors die with it
    BlockActivations& s = keep && !k.recomputed ? act.blocks[static_cast<std::size_t>(l)] : scratch;
    x = block_forward(ctx, l, act.B, act.T, x, s, pc, true, keep);
    if (fp8_ && keep) {
      // A recomputed block keeps its FP8 layers' scales: the recompute casts with them again.
      if (k.recomputed)
        for (int g = 0; g < kFp8GemmsPerBlock; ++g)
          act.blocks[static_cast<std::size_t>(l)].fp8[static_cast<std::size_t>(g)].scales =
              s.fp8[static_cast<std::size_t>(g)].scales;
      if (k.drop_ffn_inputs)   // selective-mlp: w1|w3 is replayed with a and b in the backward
        s.fp8[static_cast<std::size_t>(Fp8Gemm::w13)].drop_operands();
    }
    if (dims_.is_moe_block(l)) {
      // The router losses of this forward (a recompute in the backward does not add them again).
      Tensor terms = Tensor::empty({3}, stats_, *ctx.allocator, "activations");
      ops::moe_router_losses(ctx, s.moe.probs, s.moe.lse, s.moe.experts, act.T, dims_.moe_aux_loss, dims_.moe_z_loss,
                             terms);
      Tensor weighted = terms.slice(2, 3);
      ops::add(ctx, act.moe_loss, weighted, act.moe_loss);
      if (keep) record_moe_stats(ctx, l, s, terms);
      if (!keep) s.moe = MoeActivations{};
    }
    if (k.attention) {   // the recompute skips the attention (recompute.h)
      act.blocks[static_cast<std::size_t>(l)].o = s.o;
      act.blocks[static_cast<std::size_t>(l)].attn_aux = s.attn_aux;
    }
    if (k.drop_norms) {   // rebuilt in the backward from what stays
      s.y1 = Tensor();
      s.y2 = Tensor();
      s.g = Tensor();
    }
    if (k.drop_probabilities) s.attn_aux = Tensor();
    if (k.drop_ffn_inputs) {
      s.a = Tensor();
      s.b = Tensor();
    }
    call(pc.after_forward, l + 1);
  }
  return x;
}

Tensor TransformerLM::block_forward(Context& ctx, int l, std::int64_t B, std::int64_t T, const Tensor& x,
                                    BlockActivations& s, const ParallelContext& pc, bool need_output,
                                    bool record_fp8) {
  // Tensor parallel: this rank's heads (dl = Hl*Dh columns) and FFN features (Fl); x, h and the
  // norms' outputs are [Nl,d] row shards under sequence parallelism.
  const std::int64_t N = B * T, Nl = local_rows(N), d = dims_.d_model, F = Fl_, H = Hl_, Dh = dims_.head_dim();
  Allocator& A = *ctx.allocator;
  const BlockParams p = block_params(l);
  auto W = [&](int i) { return params_.compute_weight(i); };
  auto act = [&](std::int64_t cols) { return Tensor::empty({N, cols}, compute_, A, "activations"); };
  auto act_local = [&](std::int64_t cols) { return Tensor::empty({Nl, cols}, compute_, A, "activations"); };
  s.x = x;
  Tensor proj;   // the output projection [Nl,d]; the fused residual add + FFN norm below reads it
  {
    NvtxRange r("attention_block");
    s.rstd1 = Tensor::empty({Nl}, stats_, A, "activations");
    s.y1 = act_local(d);
    Fp8ProducerAmax y1_amax = fp8_input_amax(l, Fp8Gemm::qkv, s);   // the qkv layer's x is y1
    ops::rmsnorm(ctx, x, W(p.ln1), dims_.norm_eps, s.y1, s.rstd1, y1_amax.out());
    {
      const Tensor y1 = tp_f(pc, ctx, s.y1);   // [N,d]; gathered rows are dropped after the matmuls
      // q|k|v side by side in the rows of one [N, 3*dl] tensor: one GEMM against the three
      // weights (back to back in the store; under fp8 one FP8 layer over [3dl, d]), and RoPE once
      // over q|k as the first 2H heads of each row (row stride 3*dl).
      Tensor qkv = Tensor::empty({N, 3 * dl_}, compute_, A, "activations");
      s.q = column_block(qkv, 0, dl_);
      s.k = column_block(qkv, dl_, dl_);
      s.v = column_block(qkv, 2 * dl_, dl_);
      if (fp8_) fp8_linear(ctx, l, Fp8Gemm::qkv, y1, &qkv, s, record_fp8, y1_amax.source());
      else ops::linear_side_by_side(ctx, y1, {W(p.q), W(p.k), W(p.v)}, qkv);
      Tensor qk = column_block(qkv, 0, 2 * dl_);
      ops::rope(ctx, qk, B, T, 2 * H, Dh, dims_.rope_theta, false, 3 * dl_);
    }
    auto shape = ops::AttentionShape::bthd(B, T, H, Dh, true).with_qkv_row_stride(3 * dl_);
    shape.deterministic = dims_.deterministic_attention;
    // A recompute under keep_attention finds o and the aux kept from the forward: bitwise what the
    // attention would give again from the same q, k, v, so it is skipped.
    if (!present(s.o)) {
      s.o = act(dl_);
      if (dims_.flash) {
        s.attn_aux = Tensor::empty({B, H, T}, stats_, A, "activations");
        ops::attention_flash(ctx, shape, s.q, s.k, s.v, s.o, s.attn_aux);
      } else {
        s.attn_aux = Tensor::empty({B, H, T, T}, compute_, A, "attention_probs");
        ops::attention_naive(ctx, shape, s.q, s.k, s.v, s.o, s.attn_aux);
      }
    }
    proj = act(d);
    if (fp8_) fp8_linear(ctx, l, Fp8Gemm::o, s.o, &proj, s, record_fp8);
    else ops::linear(ctx, s.o, W(p.o), proj);   // row-parallel: this rank's heads' share of the sum
    proj = tp_g(pc, ctx, proj);           // [Nl,d]
    s.h = act_local(d);
  }
  NvtxRange r("ffn_block");
  s.rstd2 = Tensor::empty({Nl}, stats_, A, "activations");
  s.y2 = act_local(d);
  // h = x + proj, y2 = rmsnorm2(h); y2 is the w13 layer's x (MoE blocks have no FP8 layers).
  Fp8ProducerAmax y2_amax = dims_.is_moe_block(l) ? Fp8ProducerAmax{} : fp8_input_amax(l, Fp8Gemm::w13, s);
  ops::add_rmsnorm(ctx, x, proj, W(p.ln2), dims_.norm_eps, s.h, s.y2, s.rstd2, y2_amax.out());
  proj = Tensor();
  if (dims_.is_moe_block(l)) {   // the experts behind the router (transformer_moe.cpp)
    Tensor out = moe_ffn_forward(ctx, l, T, s.y2, s, pc);
    if (!need_output) return Tensor();
    ops::add(ctx, s.h, out, out);
    return out;
  }
  ffn_inputs(ctx, s, tp_f(pc, ctx, s.y2), l, record_fp8, y2_amax.source());
  // g = silu(a) * b, the w2 layer's x; under delayed FP8 scaling the SwiGLU kernel casts it
  // itself and g is never stored (fp8_swiglu_casts_fused). Under FP8 g is dropped after the w2
  // layer's cast: its backward reads the saved g^T.
  const bool g_in_fp8_only = fp8_swiglu_fused(l, s);
  Fp8ProducerAmax g_amax;
  if (!g_in_fp8_only) {
    s.g = act(F);
    g_amax = fp8_input_amax(l, Fp8Gemm::w2, s);
    ops::swiglu_rows(ctx, s.a, s.b, N, F, 2 * F, s.g, g_amax.out());
  }
  if (!need_output) {   // a recompute's last block (a replay, never fused): its output is not needed again
    if (fp8_) fp8_linear(ctx, l, Fp8Gemm::w2, s.g, nullptr, s, record_fp8, g_amax.source());   // operands only
    if (fp8_) s.g = Tensor();
    return Tensor();
  }
  Tensor out = act(d);
  if (g_in_fp8_only) fp8_linear_from_swiglu(ctx, l, s, N, out, record_fp8);
  else if (fp8_) fp8_linear(ctx, l, Fp8Gemm::w2, s.g, &out, s, record_fp8, g_amax.source());
  else ops::linear(ctx, s.g, W(p.w2), out);   // row-parallel partial sum
  if (fp8_) s.g = Tensor();
  out = tp_g(pc, ctx, out);             // [Nl,d]
  ops::add(ctx, s.h, out, out);
  return out;
}

BlockParams TransformerLM::block_params(int l) const {
  const BlockParams f = ParamIndex(dims_).block(l);
  auto at = [&](int i) { return params_.local_index(i); };
  return {.q = at(f.q), .k = at(f.k), .v = at(f.v), .o = at(f.o), .ln1 = at(f.ln1), .w1 = at(f.w1), .w3 = at(f.w3),
          .w2 = at(f.w2), .ln2 = at(f.ln2), .router = f.router >= 0 ? at(f.router) : -1};
}

void TransformerLM::ffn_inputs(Context& ctx, BlockActivations& s, const Tensor& y2, int l, bool record_fp8,
                               ops::Fp8Amax y2_amax) {
  // a = w1 y2 and b = w3 y2 [N,Fl]: column blocks of one [N, 2Fl] tensor (a|b side by side, row
  // stride 2Fl; one GEMM against [W1; W3], which the store holds back to back, a tensor-parallel
  // rank's slices too; under fp8 one FP8 layer over [2Fl, d]).
  const BlockParams p = block_params(l);
  const std::int64_t N = y2.dim(0);
  Tensor ab = Tensor::empty({N, 2 * Fl_}, compute_, *ctx.allocator, "activations");
  s.a = column_block(ab, 0, Fl_);
  s.b = column_block(ab, Fl_, Fl_);
  if (fp8_) fp8_linear(ctx, l, Fp8Gemm::w13, y2, &ab, s, record_fp8, y2_amax);
  else ops::linear_side_by_side(ctx, y2, {params_.compute_weight(p.w1), params_.compute_weight(p.w3)}, ab);
}

void TransformerLM::recompute_norm(Context& ctx, const Tensor& x, const Tensor& w, Tensor& y, std::int64_t N,
                                   std::int64_t d) {
  if (present(y)) return;
  y = Tensor::empty({N, d}, compute_, *ctx.allocator, "activation_grads");
  Tensor rstd = Tensor::empty({N}, stats_, *ctx.allocator, "activation_grads");   // the kept rstd's twin
  ops::rmsnorm(ctx, x, w, dims_.norm_eps, y, rstd);
}

Tensor TransformerLM::grad_for_adding(Context& ctx, int i, bool accumulate) {
  Tensor g = params_.grad(i);
  if (!accumulate) ops::fill(ctx, g, 0.0);
  return g;
}

void TransformerLM::weight_grads(Context& ctx, const ParallelContext& pc, const Tensor& x, Tensor dy,
                                 std::vector<int> params, bool accumulate, std::vector<WeightGradWork>* defer,
                                 const Tensor& residual) {
  if (defer) {
    if (dy.data() == residual.data()) {
      Tensor copy = Tensor::empty(dy.shape(), dy.dtype(), *ctx.allocator, "activation_grads");
      ops::copy(ctx, dy, copy);
      dy = copy;
    }
    defer->push_back({x, std::move(dy), std::move(params), accumulate});
    return;
  }
  std::vector<WeightGradWork> now{{x, std::move(dy), std::move(params), accumulate}};
  backward_weights(ctx, now, pc);
}

void TransformerLM::backward_weights(Context& ctx, std::vector<WeightGradWork>& work, const ParallelContext& pc) {
  NvtxRange r("weight_gradients");
  for (WeightGradWork& w : work) {
    std::vector<Tensor> ws, gs;
    for (int i : w.params) {
      ws.push_back(params_.compute_weight(i));
      gs.push_back(params_.grad(i));
    }
    if (ws.size() == 1) ops::linear_backward(ctx, w.x, ws[0], w.dy, nullptr, &gs[0], w.accumulate);
    else ops::linear_side_by_side_backward(ctx, w.x, ws, w.dy, nullptr, &gs, w.accumulate);
    for (int i : w.params) notify(pc, i);
    w = WeightGradWork{};   // frees the inputs as the W pass goes
  }
  work.clear();
}

void TransformerLM::block_backward(Context& ctx, int l, BlockActivations& s, Tensor& dx, const ParallelContext& pc,
                                   std::int64_t B, std::int64_t T, bool accumulate, double grad_scale,
                                   std::vector<WeightGradWork>* defer) {
  // Local shapes as in block_forward; dx is [Nl,d].
  const std::int64_t N = B * T, Nl = local_rows(N), d = dims_.d_model, F = Fl_;
  Allocator& A = *ctx.allocator;
  const BlockParams p = block_params(l);
  auto W = [&](int i) { return params_.compute_weight(i); };
  auto G = [&](int i) { return params_.grad(i); };
  auto act = [&](std::int64_t cols) { return Tensor::empty({N, cols}, compute_, A, "activation_grads"); };
  if (fp8_ && !dims_.is_moe_block(l)) {
    LMSCALE_CHECK(!defer, "precision.mode = fp8 has no deferred weight gradients (pipeline schedules)");
    return block_backward_fp8(ctx, l, s, dx, pc, B, T, accumulate);
  }
  if (dims_.is_moe_block(l)) {
    // MoE FFN: out = h + moe(y2), y2 = rmsnorm2(h); dx holds d(out).
    NvtxRange r("moe_block_backward");
    Tensor dy2 = moe_ffn_backward(ctx, l, T, s, dx, pc, accumulate, grad_scale);
    Tensor gLn2 = grad_for_adding(ctx, p.ln2, accumulate);
    norm_backward(pc, ctx, s.h, W(p.ln2), s.rstd2, dy2, dx, gLn2, true);   // dx += d(h) through the norm
    notify(pc, p.ln2);
    s.y2 = Tensor();
    s.h = Tensor();
  } else {
    // FFN: out = h + g(w2(silu(w1 f(y2)) * w3 f(y2))), y2 = rmsnorm2(h); dx holds d(out).
    NvtxRange r("ffn_block_backward");
    if (!present(s.a)) {   // selective-mlp: y2, then a = w1 y2 and b = w3 y2 again
      recompute_norm(ctx, s.h, W(p.ln2), s.y2, Nl, d);   // [Nl,d]; tensor parallel: the local a, b [N,Fl]
      ffn_inputs(ctx, s, tp_f(pc, ctx, s.y2), l);
    }
    if (!present(s.g)) {   // selective checkpointing: g = silu(a) * b again
      s.g = act(F);
      ops::swiglu_rows(ctx, s.a, s.b, N, F, 2 * F, s.g);
    }
    Tensor dg = act(F);
    {
      const Tensor dout = tp_g_backward(pc, ctx, dx);   // [N,d]
      ops::linear_backward(ctx, s.g, W(p.w2), dout, &dg, nullptr, accumulate);
      weight_grads(ctx, pc, s.g, dout, {p.w2}, accumulate, defer, dx);
    }
    s.g = Tensor();
    // da|db side by side in the rows of one [N, 2F] tensor, in a|b's layout.
    const Tensor dab = Tensor::empty({N, 2 * F}, compute_, A, "activation_grads");
    Tensor da = column_block(dab, 0, F), db = column_block(dab, F, F);
    ops::swiglu_rows_backward(ctx, s.a, s.b, N, F, 2 * F, dg, da, db);
    dg = Tensor();
    s.a = Tensor();
    s.b = Tensor();
    recompute_norm(ctx, s.h, W(p.ln2), s.y2, Nl, d);   // selective: y2 = rmsnorm2(h) again
    // dy2 = [da db] [W1; W3]: one GEMM with inner dimension 2F (W1, W3 back to back in the store);
    // [dW1; dW3] (+)= dab^T y2 one GEMM too where their gradients are back to back (a flat buffer,
    // an FSDP unit; ZeRO-2's buckets may split them: ops::linear_side_by_side_backward's fallback).
    Tensor dy2 = act(d);
    // Deferred (B pass): the input gradient only; the weight gradients wait for the W pass.
    const std::vector<Tensor> w13 = {W(p.w1), W(p.w3)}, g13 = {G(p.w1), G(p.w3)};
    if (defer) {
      const Tensor y2 = tp_f(pc, ctx, s.y2);   // sequence parallel: the gathered rows, kept for W
      ops::linear_side_by_side_backward(ctx, y2, w13, dab, &dy2, nullptr, accumulate);
      weight_grads(ctx, pc, y2, dab, {p.w1, p.w3}, accumulate, defer, dx);
      if (tp_.active()) dy2 = tp_f_backward(pc, ctx, dy2);   // [Nl,d]
    } else if (!tp_.active()) {
      ops::linear_side_by_side_backward(ctx, s.y2, w13, dab, &dy2, &g13, accumulate);
      notify(pc, p.w1);
      notify(pc, p.w3);
    } else {
      // Tensor parallel: the input gradient first, so that its f-backward collective runs while
      // the weight-gradient GEMMs (which do not read it) compute.
      const Tensor y2 = tp_f(pc, ctx, s.y2);   // sequence parallel: gathered again, as Megatron does
      ops::linear_side_by_side_backward(ctx, y2, w13, dab, &dy2, nullptr, accumulate);
      PendingGrad pending = tp_f_backward_start(pc, ctx, dy2);
      ops::linear_side_by_side_backward(ctx, y2, w13, dab, nullptr, &g13, accumulate);
      notify(pc, p.w1);
      notify(pc, p.w3);
      dy2 = pending.finish();   // [Nl,d]
    }
    Tensor gLn2 = grad_for_adding(ctx, p.ln2, accumulate);
    norm_backward(pc, ctx, s.h, W(p.ln2), s.rstd2, dy2, dx, gLn2, true);   // dx += the norm's input gradient: d(h)
    notify(pc, p.ln2);
    s.y2 = Tensor();
    s.h = Tensor();
  }
  NvtxRange r("attention_block_backward");
  // Attention: h = x + g(output_proj(attn(rope(q), rope(k), v))), q,k,v = proj(f(rmsnorm1(x))).
  Tensor dO = act(dl_);
  {
    const Tensor dproj = tp_g_backward(pc, ctx, dx);   // [N,d]
    ops::linear_backward(ctx, s.o, W(p.o), dproj, &dO, nullptr, accumulate);
    weight_grads(ctx, pc, s.o, dproj, {p.o}, accumulate, defer, dx);
  }
  // dq|dk|dv side by side [N, 3dl], in q|k|v's layout.
  const Tensor dqkv = attention_core_backward(ctx, s, dO, B, T);
  dO = Tensor();
  recompute_norm(ctx, s.x, W(p.ln1), s.y1, Nl, d);   // selective: y1 = rmsnorm1(x) again
  // dy1 = [dq dk dv] [wq; wk; wv]: one GEMM with inner dimension 3dl when the weights lie back to
  // back (else three, added in the GEMM epilogues); dWq, dWk, dWv one GEMM (or batched).
  Tensor dy1 = act(d);
  const std::vector<Tensor> wqkv = {W(p.q), W(p.k), W(p.v)}, gqkv = {G(p.q), G(p.k), G(p.v)};
  auto notify_qkv = [&] {
    for (int i : {p.q, p.k, p.v}) notify(pc, i);
  };
  if (defer) {
    const Tensor y1 = tp_f(pc, ctx, s.y1);
    ops::linear_side_by_side_backward(ctx, y1, wqkv, dqkv, &dy1, nullptr, accumulate);
    weight_grads(ctx, pc, y1, dqkv, {p.q, p.k, p.v}, accumulate, defer, dx);
    if (tp_.active()) dy1 = tp_f_backward(pc, ctx, dy1);   // [Nl,d]
  } else if (!tp_.active()) {
    ops::linear_side_by_side_backward(ctx, s.y1, wqkv, dqkv, &dy1, &gqkv, accumulate);
    notify_qkv();
  } else {
    // As in the FFN: input gradients, then f backward overlapped with the weight gradients.
    const Tensor y1 = tp_f(pc, ctx, s.y1);
    ops::linear_side_by_side_backward(ctx, y1, wqkv, dqkv, &dy1, nullptr, accumulate);
    PendingGrad pending = tp_f_backward_start(pc, ctx, dy1);
    ops::linear_side_by_side_backward(ctx, y1, wqkv, dqkv, nullptr, &gqkv, accumulate);
    notify_qkv();
    dy1 = pending.finish();   // [Nl,d]
  }
  Tensor gLn1 = grad_for_adding(ctx, p.ln1, accumulate);
  norm_backward(pc, ctx, s.x, W(p.ln1), s.rstd1, dy1, dx, gLn1, true);   // dx += the norm's input gradient: d(x)
  notify(pc, p.ln1);
  s = BlockActivations{};
}

Tensor TransformerLM::attention_core_backward(Context& ctx, BlockActivations& s, const Tensor& dO, std::int64_t B,
                                              std::int64_t T) {
  const std::int64_t N = B * T, H = Hl_, Dh = dims_.head_dim();
  Allocator& A = *ctx.allocator;
  // dq, dk, dv in q, k, v's layout: column blocks of one [N, 3dl] tensor.
  const Tensor dqkv = Tensor::empty({N, 3 * dl_}, compute_, A, "activation_grads");
  Tensor dq = column_block(dqkv, 0, dl_), dk = column_block(dqkv, dl_, dl_), dv = column_block(dqkv, 2 * dl_, dl_);
  auto shape = ops::AttentionShape::bthd(B, T, H, Dh, true).with_qkv_row_stride(3 * dl_);
  shape.deterministic = dims_.deterministic_attention;
  if (dims_.flash) {
    ops::attention_flash_backward(ctx, shape, s.q, s.k, s.v, s.o, s.attn_aux, dO, dq, dk, dv);
  } else {
    if (!present(s.attn_aux)) {   // selective: the probabilities again (the output is discarded)
      NvtxRange rr("recompute_probs");
      s.attn_aux = Tensor::empty({B, H, T, T}, compute_, A, "attention_probs");
      Tensor o = Tensor::empty({N, dl_}, compute_, A, "activation_grads");
      ops::attention_naive(ctx, shape, s.q, s.k, s.v, o, s.attn_aux);
    }
    ops::attention_naive_backward(ctx, shape, s.q, s.k, s.v, s.attn_aux, dO, dq, dk, dv);
  }
  s.attn_aux = Tensor();
  s.o = Tensor();
  Tensor dqk = column_block(dqkv, 0, 2 * dl_);   // dq|dk: the first 2H heads of each [3dl] row
  ops::rope(ctx, dqk, B, T, 2 * H, Dh, dims_.rope_theta, true, 3 * dl_);
  return dqkv;
}

void TransformerLM::backward(Context& ctx, Activations& act, const ParallelContext& pc, bool accumulate) {
  NvtxRange range("backward");
  LMSCALE_CHECK(act.dx_final.defined() && act.loss_sum.defined(),
                "backward needs a forward with targets and keep = true (once per forward)");
  LMSCALE_CHECK(act.accumulate == accumulate,
                "backward(accumulate = {}) after a forward with accumulate = {}: the head's gradients were written "
                "in the forward, both must say the same",
                accumulate, act.accumulate);
  const std::int64_t N = act.B * act.T;
  // The head unit's backward ran in the forward (fused LM head + cross-entropy): start from the
  // gradient it left for the last block's output [Nl,d].
  Tensor dx = act.dx_final;
  act.dx_final = Tensor();
  blocks_backward(ctx, act, dx, pc, accumulate);
  NvtxRange r("embedding_backward");
  call(pc.before_backward, 0);
  Tensor gEmb = grad_for_adding(ctx, 0, accumulate);
  embed_backward(pc, ctx, act.tokens.reshape({N}), dx, gEmb);
  notify(pc, 0);
  call(pc.after_backward, 0);
}

void TransformerLM::blocks_backward(Context& ctx, Activations& act, Tensor& dx, const ParallelContext& pc,
                                    bool accumulate) {
  // Blocks [l0, l1) of this store (all, or a pipeline stage's range).
  const int l0 = units_.first_layer(), l1 = units_.end_layer(dims_);
  if (l1 <= l0) return;
  // Without every-k a group is one block whose activations the forward kept.
  const bool every_k = !act.group_inputs.empty();
  std::vector<WeightGradWork>* defer = act.defer_weights ? &act.weight_work : nullptr;
  // Blocks [lc, l1), past the checkpointed ones (train.checkpoint_layers), kept everything: their
  // backwards first, one at a time, as without checkpointing.
  const int lc = every_k ? recompute_.checkpointed_end(l0, l1) : l1;
  for (int l = l1 - 1; l >= lc; --l) {
    call(pc.before_backward, l + 1);
    NvtxRange r("layer_backward");
    block_backward(ctx, l, act.blocks[static_cast<std::size_t>(l)], dx, pc, act.B, act.T, accumulate, act.grad_scale,
                     defer);
    call(pc.after_backward, l + 1);
  }
  if (lc <= l0) return;
  const int k = every_k ? recompute_.k : 1;
  for (int g = (lc - 1) / k; g >= l0 / k; --g) {   // groups [g k, (g+1) k) within [l0, lc), last first
    const int lo = std::max(l0, g * k), hi = std::min(lc, g * k + k);
    for (int l = hi - 1; l >= lo; --l) call(pc.before_backward, l + 1);
    if (every_k) {
      NvtxRange r("recompute");
      Tensor x = act.group_inputs[static_cast<std::size_t>(g)];
      act.group_inputs[static_cast<std::size_t>(g)] = Tensor();
      for (int l = lo; l < hi; ++l)
        x = block_forward(ctx, l, act.B, act.T, x, act.blocks[static_cast<std::size_t>(l)], pc, l + 1 < hi);
    }
    for (int l = hi - 1; l >= lo; --l) {
      NvtxRange r("layer_backward");
      block_backward(ctx, l, act.blocks[static_cast<std::size_t>(l)], dx, pc, act.B, act.T, accumulate, act.grad_scale,
                     defer);
      call(pc.after_backward, l + 1);
    }
  }
}

}  // namespace lmscale::model
