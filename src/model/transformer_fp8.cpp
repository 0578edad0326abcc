// TransformerLM's FP8 linear layers (precision.mode = fp8, docs/precision.md "FP8 training"):
// the forward's calls through ops::Fp8Linear with their saved operands, the replay of a
// recompute, and a dense block's backward with its seven layers' gradients in FP8.
#include <algorithm>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/ops.h"

namespace lmscale::model {

namespace {
void notify(const ParallelContext& pc, int i) {
  if (pc.on_grad_ready) pc.on_grad_ready(i);
}
// Matrix i of a [n, rows, cols] tensor as a [rows, cols] view.
Tensor part(const Tensor& t, std::int64_t i) { return t.slice(i, i + 1).reshape({t.dim(1), t.dim(2)}); }
ops::Fp8LinearSaved& saved_of(BlockActivations& s, Fp8Gemm g) { return s.fp8[static_cast<std::size_t>(g)]; }
}  // namespace

void TransformerLM::enable_fp8(Context& ctx, const ops::Fp8LinearOptions& options) {
  LMSCALE_CHECK(!tp_.active(), "precision.mode = fp8 with tensor parallelism is not supported (set parallel.tp = 1)");
  LMSCALE_CHECK(!dims_.moe(), "precision.mode = fp8 with an MoE model is not supported (set model.moe_experts = 0)");
  fp8_ = std::make_unique<Fp8Layers>(ctx, options, units_.first_layer(), units_.end_layer(dims_));
}

void TransformerLM::fp8_linear(Context& ctx, int layer, std::initializer_list<Fp8Gemm> gemms, const Tensor& x,
                               std::initializer_list<int> params, std::initializer_list<Tensor*> ys,
                               BlockActivations& s, bool record) {
  LMSCALE_CHECK(gemms.size() == params.size() && gemms.size() == ys.size() && gemms.size() > 0,
                "fp8_linear: {} layers, {} weights, {} outputs", gemms.size(), params.size(), ys.size());
  const Fp8Gemm first = *gemms.begin();
  for (Fp8Gemm g : gemms)
    LMSCALE_CHECK(fp8_input_owner(g) == first, "fp8_linear: block {} layer {} does not share {}'s input", layer,
                  fp8_gemm_name(g), fp8_gemm_name(first));
  const bool replay = saved_of(s, first).scales.defined();   // a recompute: the first forward's scales again
  const bool any_y = std::any_of(ys.begin(), ys.end(), [](const Tensor* y) { return y != nullptr; });
  ops::Fp8Linear& owner = fp8_->at(layer, first);
  const ops::Fp8Input xq = replay ? owner.replay_input(ctx, saved_of(s, first).scales, x, any_y)
                                  : owner.quantize_input(ctx, x, record);
  auto param = params.begin();
  auto y = ys.begin();
  for (Fp8Gemm g : gemms) {
    ops::Fp8Linear& lin = fp8_->at(layer, g);
    ops::Fp8LinearSaved& saved = saved_of(s, g);
    const Tensor w = params_.compute_weight(*param);
    // fsdp's FP8 gathers hand the weight out quantised, bitwise the cast below would make.
    const bool quantised = w.dtype() == DType::e4m3;
    if (replay) {
      saved = quantised ? lin.replay(ctx, saved.scales, xq, params_.fp8_weight(*param), *y)
                        : lin.replay(ctx, saved.scales, xq, w, *y);
    } else {
      LMSCALE_CHECK(*y, "fp8_linear: a first forward of block {} layer {} needs its output", layer,
                    fp8_gemm_name(g));
      saved = quantised ? lin.forward(ctx, xq, params_.fp8_weight(*param), **y) : lin.forward(ctx, xq, w, **y, record);
    }
    ++param;
    ++y;
  }
}

void TransformerLM::fp8_linear_backward(Context& ctx, const ParallelContext& pc, int layer, Fp8Gemm g,
                                        BlockActivations& s, const Tensor& dy, Tensor* dx, int param,
                                        bool accumulate) {
  ops::Fp8LinearSaved& saved = saved_of(s, g);
  LMSCALE_CHECK(saved.has_operands(), "block {} layer {}: the FP8 backward found no saved operands", layer,
                fp8_gemm_name(g));
  Tensor dw = params_.grad(param);
  fp8_->at(layer, g).backward(ctx, saved, dy, dx, &dw, accumulate);
  notify(pc, param);
  saved = ops::Fp8LinearSaved{};
}

void TransformerLM::block_backward_fp8(Context& ctx, int l, BlockActivations& s, Tensor& dx,
                                       const ParallelContext& pc, std::int64_t B, std::int64_t T, bool accumulate) {
  // block_backward's dense form without tensor parallelism (refused with fp8), every linear
  // layer's two gradient products in FP8 from its saved operands: y1, y2 and g are not read
  // (their role is the saved x^T's), so the selective modes rebuild them only to replay w1, w3.
  const std::int64_t N = B * T, d = dims_.d_model, F = Fl_;
  Allocator& A = *ctx.allocator;
  const BlockParams p = block_params(l);
  auto W = [&](int i) { return params_.compute_weight(i); };
  auto act = [&](std::int64_t cols) { return Tensor::empty({N, cols}, compute_, A, "activation_grads"); };
  {
    NvtxRange r("ffn_block_backward");
    if (!s.a.defined() || s.a.numel() == 0) {   // selective-mlp: y2, then a and b replayed with their scales
      recompute_norm(ctx, s.h, W(p.ln2), s.y2, N, d);
      ffn_inputs(ctx, s, s.y2, l);
    }
    s.g = Tensor();   // w2's backward reads its saved g^T
    Tensor dg = act(F);
    fp8_linear_backward(ctx, pc, l, Fp8Gemm::w2, s, dx, &dg, p.w2, accumulate);
    const Tensor dab = Tensor::empty({2, N, F}, compute_, A, "activation_grads");   // da, db side by side
    Tensor da = part(dab, 0), db = part(dab, 1);
    ops::swiglu_backward(ctx, s.a, s.b, dg, da, db);
    dg = Tensor();
    s.a = Tensor();
    s.b = Tensor();
    s.y2 = Tensor();
    // dy2 = da w1 + db w3: the second product into a temporary, then added.
    Tensor dy2 = act(d);
    fp8_linear_backward(ctx, pc, l, Fp8Gemm::w1, s, da, &dy2, p.w1, accumulate);
    {
      Tensor part3 = act(d);
      fp8_linear_backward(ctx, pc, l, Fp8Gemm::w3, s, db, &part3, p.w3, accumulate);
      ops::add(ctx, dy2, part3, dy2);
    }
    Tensor gLn2 = grad_for_adding(ctx, p.ln2, accumulate);
    norm_backward(pc, ctx, s.h, W(p.ln2), s.rstd2, dy2, dx, gLn2, true);   // dx += d(h) through the norm
    notify(pc, p.ln2);
    s.h = Tensor();
  }
  NvtxRange r("attention_block_backward");
  Tensor dO = act(dl_);
  fp8_linear_backward(ctx, pc, l, Fp8Gemm::o, s, dx, &dO, p.o, accumulate);
  const Tensor dqkv = attention_core_backward(ctx, s, dO, B, T);
  dO = Tensor();
  s.y1 = Tensor();
  // dy1 = dq wq + dk wk + dv wv: the first product in place, the others through one temporary.
  Tensor dy1 = act(d);
  fp8_linear_backward(ctx, pc, l, Fp8Gemm::q, s, part(dqkv, 0), &dy1, p.q, accumulate);
  {
    Tensor term = act(d);
    fp8_linear_backward(ctx, pc, l, Fp8Gemm::k, s, part(dqkv, 1), &term, p.k, accumulate);
    ops::add(ctx, dy1, term, dy1);
    fp8_linear_backward(ctx, pc, l, Fp8Gemm::v, s, part(dqkv, 2), &term, p.v, accumulate);
    ops::add(ctx, dy1, term, dy1);
  }
  Tensor gLn1 = grad_for_adding(ctx, p.ln1, accumulate);
  norm_backward(pc, ctx, s.x, W(p.ln1), s.rstd1, dy1, dx, gLn1, true);   // dx += d(x) through the norm
  notify(pc, p.ln1);
  s = BlockActivations{};
}

}  // namespace lmscale::model
