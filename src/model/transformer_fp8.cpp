// TransformerLM's FP8 linear layers (precision.mode = fp8, docs/precision.md "FP8 training"):
// the forward's calls through ops::Fp8Linear with their saved operands, the replay of a
// recompute, and a dense block's backward with its layers' gradients in FP8. q|k|v and w1|w3
// (back to back in the store) are one FP8 layer each over the group's weight [3dl, d] ([2F, d])
// and the side-by-side activation [N, 3dl] ([N, 2F]).

#include <algorithm>
#include <utility>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/ops.h"

namespace lmscale::model {

namespace {
void notify(const ParallelContext& pc, int i) {
  if (pc.on_grad_ready) pc.on_grad_ready(i);
}
// Columns [col0, col0 + cols) of a [rows, ld] tensor as the flat view the row-strided ops read.
Tensor column_block(const Tensor& t, std::int64_t col0, std::int64_t cols) {
  return t.flat_range(col0, (t.dim(0) - 1) * t.dim(1) + cols);
}
ops::Fp8LinearSaved& saved_of(BlockActivations& s, Fp8Gemm g) { return s.fp8[static_cast<std::size_t>(g)]; }

// The matrices ts [R_i, K] as one [sum R_i, K] view when each starts where the one before ends
// (same dtype and K): a group's weights or gradients in the store's flat buffers. Undefined if not.
Tensor rows_back_to_back(const std::vector<Tensor>& ts) {
  std::int64_t rows = 0;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    if (t.ndim() != 2 || t.dtype() != ts[0].dtype() || t.dim(1) != ts[0].dim(1)) return Tensor();
    if (i > 0 && static_cast<const char*>(t.data()) !=
                     static_cast<const char*>(ts[i - 1].data()) + ts[i - 1].numel() * dtype_size(t.dtype()))
      return Tensor();
    rows += t.dim(0);
  }
  if (ts.size() == 1) return ts[0];
  return Tensor::view(ts[0].data(), {rows, ts[0].dim(1)}, ts[0].dtype(), ts[0].device());
}
}  // namespace

void TransformerLM::enable_fp8(Context& ctx, const ops::Fp8LinearOptions& options) {
  LMSCALE_CHECK(!tp_.active(), "precision.mode = fp8 with tensor parallelism is not supported (set parallel.tp = 1)");
  LMSCALE_CHECK(!dims_.moe(), "precision.mode = fp8 with an MoE model is not supported (set model.moe_experts = 0)");
  // q|k|v and w1|w3 are one FP8 layer each: their weights must be consecutive store parameters.
  for (int l = units_.first_layer(); l < units_.end_layer(dims_); ++l)
    check_fp8_groups_back_to_back(ParamIndex(dims_).block(l), l);
  fp8_ = std::make_unique<Fp8Layers>(ctx, options, units_.first_layer(), units_.end_layer(dims_));
}

void TransformerLM::enable_fp8_weight_casts(Context& ctx) {
  LMSCALE_CHECK(fp8_ && fp8_->options().recipe == ops::Fp8Recipe::delayed && ctx.device == Device::cuda &&
                    params_.has_lowp() && params_.has_whole_master(),
                "FP8 weight casts in the optimizer step need delayed scaling on CUDA over a store with its fp32 "
                "master and working copy (docs/precision.md)");
  std::vector<ops::Fp8WeightCast> casts;
  const int first = fp8_->first_layer(), end = fp8_->end_layer();
  const std::int64_t count = static_cast<std::int64_t>(end - first) * kFp8GemmsPerBlock;
  Tensor pending = Tensor::empty({std::max<std::int64_t>(count, 1)}, DType::f32, *ctx.allocator, "fp8_weight_amax");
  for (int l = first; l < end; ++l) {
    for (Fp8Gemm g : kFp8BlockGemms) {
      const std::vector<int> ps = fp8_gemm_params(block_params(l), g);
      const ParamInfo& p0 = params_.infos()[static_cast<std::size_t>(ps.front())];
      std::int64_t rows = 0;
      for (int i : ps) rows += params_.infos()[static_cast<std::size_t>(i)].shape[0];
      const std::int64_t cols = p0.shape[1];
      LMSCALE_CHECK(ops::fp8_weight_cast_shape(rows, cols),
                    "block {} FP8 layer {}: its weight [{}, {}] is not of 64-multiples, which the optimizer step's "
                    "casts need (set precision.fp8_weight_casts = forward)", l, fp8_gemm_name(g), rows, cols);
      ops::Fp8Linear& lin = fp8_->at(l, g);
      ops::Fp8TensorScaling& w = lin.w_scaling();
      ops::Fp8WeightCast c;
      c.offset = p0.offset;
      c.rows = rows;
      c.cols = cols;
      c.q = Tensor::empty({rows, cols}, DType::e4m3, *ctx.allocator, "fp8_weights");
      c.qt = Tensor::empty({cols, rows}, DType::e4m3, *ctx.allocator, "fp8_weights");
      c.scale = w.scale();
      c.pending_amax = pending.flat_range(static_cast<std::int64_t>(casts.size()), 1);
      c.history = w.history_update();
      casts.push_back(std::move(c));
    }
  }
  ops::fill(ctx, pending, 0.0);
  fp8_casts_ = std::make_unique<Fp8WeightCasts>(std::move(casts), params_.flat_params(), params_.lowp_dtype());
}

std::size_t TransformerLM::fp8_cast_index(int layer, Fp8Gemm g) const {
  return static_cast<std::size_t>((layer - fp8_->first_layer()) * kFp8GemmsPerBlock + static_cast<int>(g));
}

Tensor TransformerLM::fp8_group_weight(int layer, Fp8Gemm g) const {
  std::vector<Tensor> ws;
  for (int i : fp8_gemm_params(block_params(layer), g)) ws.push_back(params_.compute_weight(i));
  const Tensor w = rows_back_to_back(ws);
  // Every store layout holds a group's working copies back to back (one flat buffer, or fsdp's
  // gathered unit, members consecutive); a layout that did not would need the group copied.
  LMSCALE_CHECK(w.defined(), "block {} FP8 layer {}: its weights do not lie back to back in the parameter store; "
                "precision.mode = fp8 needs them so (docs/precision.md)", layer, fp8_gemm_name(g));
  return w;
}

ops::Fp8Weight TransformerLM::fp8_group_weight_quantised(int layer, Fp8Gemm g) const {
  // fsdp's FP8 gathers cast a group's weights with ONE scale (the max of their amaxes) into one
  // gathered buffer: the members are back to back and share their scale tensors.
  const std::vector<int> ps = fp8_gemm_params(block_params(layer), g);
  std::vector<ops::Fp8Weight> ws;
  std::vector<Tensor> qs;
  for (int i : ps) {
    ws.push_back(params_.fp8_weight(i));
    qs.push_back(ws.back().q);
  }
  const Tensor q = rows_back_to_back(qs);
  for (const ops::Fp8Weight& w : ws)
    LMSCALE_CHECK(q.defined() && w.scale.data() == ws[0].scale.data() && w.inv.data() == ws[0].inv.data(),
                  "block {} FP8 layer {}: its weights arrived in FP8 apart or with different scales; an FP8 weight "
                  "gather must cast a group's weights with one scale into one buffer (parallel/fsdp_fp8_gather.h)",
                  layer, fp8_gemm_name(g));
  return {q, ws[0].amax, ws[0].scale, ws[0].inv};
}

Fp8ProducerAmax TransformerLM::fp8_input_amax(int layer, Fp8Gemm g, const BlockActivations& s) {
  if (!fp8_ || fp8_->options().recipe != ops::Fp8Recipe::current || !fp8_->options().producer_amax) return {};
  if (s.fp8[static_cast<std::size_t>(g)].scales.defined()) return {};   // a replay casts with saved scales
  return {fp8_->at(layer, g).x_producer_amax()};
}

Fp8ProducerAmax TransformerLM::fp8_grad_amax(int layer, Fp8Gemm g) {
  if (!fp8_ || fp8_->options().recipe != ops::Fp8Recipe::current || !fp8_->options().producer_amax) return {};
  return {fp8_->at(layer, g).dy_producer_amax()};
}

bool TransformerLM::fp8_w2_grad_amax_from_above(int layer) const {
  // blocks_backward runs block l + 1's backward, then (after hooks and a recompute's replays,
  // which leave the residual gradient dx and the dy slots alone) block l's, whose w2 layer reads
  // dx first. The top block's dx comes from the head (or another stage): measured.
  return fp8_ && fp8_->options().recipe == ops::Fp8Recipe::current && fp8_->options().producer_amax &&
         layer >= fp8_->first_layer() && layer + 1 < fp8_->end_layer();
}

void TransformerLM::fp8_linear(Context& ctx, int layer, Fp8Gemm g, const Tensor& x, Tensor* y, BlockActivations& s,
                               bool record, ops::Fp8Amax x_amax) {
  ops::Fp8Linear& lin = fp8_->at(layer, g);
  ops::Fp8LinearSaved& saved = saved_of(s, g);
  const bool replay = saved.scales.defined();   // a recompute: the first forward's scales again
  LMSCALE_CHECK(replay || y, "fp8_linear: a first forward of block {} layer {} needs its output", layer,
                fp8_gemm_name(g));
  LMSCALE_CHECK(!replay || x_amax == ops::Fp8Amax::measure, "fp8_linear: a replay of block {} layer {} has no amax",
                layer, fp8_gemm_name(g));
  const ops::Fp8Input xq = replay ? lin.replay_input(ctx, saved.scales, x, y != nullptr)
                                  : lin.quantize_input(ctx, x, record, x_amax);
  fp8_linear_quantised(ctx, layer, g, xq, y, s, record);
}

bool TransformerLM::fp8_swiglu_fused(int layer, const BlockActivations& s) const {
  return fp8_ && fp8_swiglu_casts_fused(fp8_->options()) && !dims_.is_moe_block(layer) &&
         !s.fp8[static_cast<std::size_t>(Fp8Gemm::w2)].scales.defined();   // a replay: its scales saved
}

void TransformerLM::fp8_linear_from_swiglu(Context& ctx, int layer, BlockActivations& s, std::int64_t rows, Tensor& y,
                                           bool record) {
  const std::int64_t F = Fl_;
  const ops::Fp8Input xq = fp8_->at(layer, Fp8Gemm::w2)
                               .quantize_input(ctx, rows, F,
                                               [&](const Tensor& scale, const ops::Fp8HistoryUpdate& update, Tensor* q,
                                                   Tensor& qt) {
                                                 ops::swiglu_cast_transpose_fp8(ctx, s.a, s.b, rows, F, 2 * F, scale,
                                                                                q, qt, &update);
                                               },
                                               record);
  fp8_linear_quantised(ctx, layer, Fp8Gemm::w2, xq, &y, s, record);
}

void TransformerLM::fp8_linear_quantised(Context& ctx, int layer, Fp8Gemm g, const ops::Fp8Input& xq, Tensor* y,
                                         BlockActivations& s, bool record) {
  ops::Fp8Linear& lin = fp8_->at(layer, g);
  ops::Fp8LinearSaved& saved = saved_of(s, g);
  const bool replay = saved.scales.defined();
  // The optimizer step's casts (fp8_weight_casts.h): made now when stale, at a training forward
  // (one that records); an evaluation before them casts as without.
  if (fp8_casts_ && !fp8_casts_->ready() && record && !replay) fp8_casts_->cast_now(ctx);
  if (fp8_casts_ && fp8_casts_->ready()) {
    const ops::Fp8Weight w = fp8_casts_->weight(fp8_cast_index(layer, g));
    saved = replay ? lin.replay(ctx, saved.scales, xq, w, y) : lin.forward(ctx, xq, w, *y);
    return;
  }
  // fsdp's FP8 gathers hand the weights out quantised, bitwise the cast below would make.
  const bool quantised = params_.compute_weight(fp8_gemm_params(block_params(layer), g)[0]).dtype() == DType::e4m3;
  if (quantised) {
    const ops::Fp8Weight w = fp8_group_weight_quantised(layer, g);
    saved = replay ? lin.replay(ctx, saved.scales, xq, w, y) : lin.forward(ctx, xq, w, *y);
  } else {
    const Tensor w = fp8_group_weight(layer, g);   // [sum of the group's rows, K]
    saved = replay ? lin.replay(ctx, saved.scales, xq, w, y) : lin.forward(ctx, xq, w, *y, record);
  }
}

void TransformerLM::fp8_linear_backward(Context& ctx, const ParallelContext& pc, int layer, Fp8Gemm g,
                                        BlockActivations& s, const Tensor& dy, Tensor* dx, bool accumulate,
                                        ops::Fp8Amax dy_amax) {
  // Checked before dy's cast, which would advance the dy scaling's history.
  LMSCALE_CHECK(saved_of(s, g).has_operands(), "block {} layer {}: the FP8 backward found no saved operands", layer,
                fp8_gemm_name(g));
  ops::Fp8Linear& lin = fp8_->at(layer, g);
  fp8_linear_backward(ctx, pc, layer, g, s, lin.quantize_grad(ctx, dy, dx != nullptr, dy_amax), dx, accumulate);
}

void TransformerLM::fp8_linear_backward(Context& ctx, const ParallelContext& pc, int layer, Fp8Gemm g,
                                        BlockActivations& s, ops::Fp8Input dy, Tensor* dx, bool accumulate) {
  ops::Fp8LinearSaved& saved = saved_of(s, g);
  LMSCALE_CHECK(saved.has_operands(), "block {} layer {}: the FP8 backward found no saved operands", layer,
                fp8_gemm_name(g));
  // The group's gradients as one [sum R_i, K] (one dW GEMM) when back to back in memory, else
  // row blocks of the same product (gradient buckets that split the group).
  const std::vector<int> ps = fp8_gemm_params(block_params(layer), g);
  std::vector<Tensor> grads;
  for (int i : ps) grads.push_back(params_.grad(i));
  const Tensor one = rows_back_to_back(grads);
  fp8_->at(layer, g).backward(ctx, saved, dy, dx, one.defined() ? std::vector<Tensor>{one} : grads, accumulate);
  dy = ops::Fp8Input{};   // freed before the hooks, which may allocate (bucket reductions)
  for (int i : ps) notify(pc, i);
  saved = ops::Fp8LinearSaved{};
}

void TransformerLM::block_backward_fp8(Context& ctx, int l, BlockActivations& s, Tensor& dx,
                                       const ParallelContext& pc, std::int64_t B, std::int64_t T, bool accumulate) {
  // block_backward's dense form without tensor parallelism (refused with fp8), every linear
  // layer's two gradient products in FP8 from its saved operands: y1, y2 and g are not read
  // (their role is the saved x^T's), so the selective modes rebuild them only to replay w1|w3.
  const std::int64_t N = B * T, d = dims_.d_model, F = Fl_;
  Allocator& A = *ctx.allocator;
  const BlockParams p = block_params(l);
  auto W = [&](int i) { return params_.compute_weight(i); };
  auto act = [&](std::int64_t cols) { return Tensor::empty({N, cols}, compute_, A, "activation_grads"); };
  Fp8ProducerAmax o_dy_amax;   // written by the FFN norm's backward below
  {
    NvtxRange r("ffn_block_backward");
    if (!s.a.defined() || s.a.numel() == 0) {   // selective-mlp: y2, then a and b replayed with their scales
      recompute_norm(ctx, s.h, W(p.ln2), s.y2, N, d);
      ffn_inputs(ctx, s, s.y2, l);
    }
    s.g = Tensor();   // w2's backward reads its saved g^T
    Tensor dg = act(F);
    // dx, the w2 layer's dy: its amax written by block l + 1's last norm backward where that ran.
    const ops::Fp8Amax dx_amax = fp8_w2_grad_amax_from_above(l) ? ops::Fp8Amax::from_producer : ops::Fp8Amax::measure;
    fp8_linear_backward(ctx, pc, l, Fp8Gemm::w2, s, dx, &dg, accumulate, dx_amax);
    // da|db side by side [N, 2F] in a|b's layout: the w1|w3 layer's dy; dy2 = [da db] [w1; w3]
    // is its one dx GEMM (inner dimension 2F). dab lives to the end of the FFN's backward.
    // Under delayed scaling SwiGLU's backward casts da|db itself (fp8_swiglu_casts_fused): dab
    // is then never stored in the compute dtype, only its FP8 codes and their transpose.
    ops::Fp8Input dab_q;
    Tensor dab;
    Fp8ProducerAmax dab_amax;
    if (fp8_swiglu_casts_fused(fp8_->options())) {
      dab_q = fp8_->at(l, Fp8Gemm::w13)
                  .quantize_grad(ctx, N, 2 * F,
                                 [&](const Tensor& scale, const ops::Fp8HistoryUpdate& update, Tensor* q, Tensor& qt) {
                                   ops::swiglu_backward_cast_transpose_fp8(ctx, s.a, s.b, N, F, 2 * F, dg, scale, q, qt,
                                                                           &update);
                                 },
                                 true);
    } else {
      dab = Tensor::empty({N, 2 * F}, compute_, A, "activation_grads");
      Tensor da = column_block(dab, 0, F), db = column_block(dab, F, F);
      dab_amax = fp8_grad_amax(l, Fp8Gemm::w13);
      ops::swiglu_rows_backward(ctx, s.a, s.b, N, F, 2 * F, dg, da, db, dab_amax.out());
    }
    dg = Tensor();
    s.a = Tensor();
    s.b = Tensor();
    s.y2 = Tensor();
    Tensor dy2 = act(d);
    if (dab_q.qt.defined()) fp8_linear_backward(ctx, pc, l, Fp8Gemm::w13, s, std::move(dab_q), &dy2, accumulate);
    else fp8_linear_backward(ctx, pc, l, Fp8Gemm::w13, s, dab, &dy2, accumulate, dab_amax.source());
    Tensor gLn2 = grad_for_adding(ctx, p.ln2, accumulate);
    o_dy_amax = fp8_grad_amax(l, Fp8Gemm::o);   // dx after the norm's add is the o layer's dy
    norm_backward(pc, ctx, s.h, W(p.ln2), s.rstd2, dy2, dx, gLn2, true, o_dy_amax.out());   // dx += d(h)
    notify(pc, p.ln2);
    s.h = Tensor();
  }
  NvtxRange r("attention_block_backward");
  Tensor dO = act(dl_);
  fp8_linear_backward(ctx, pc, l, Fp8Gemm::o, s, dx, &dO, accumulate, o_dy_amax.source());
  // dq|dk|dv side by side [N, 3dl] in q|k|v's layout: the q|k|v layer's dy; dy1 = [dq dk dv]
  // [wq; wk; wv] is its one dx GEMM (inner dimension 3dl).
  const Tensor dqkv = attention_core_backward(ctx, s, dO, B, T);
  dO = Tensor();
  s.y1 = Tensor();
  Tensor dy1 = act(d);
  fp8_linear_backward(ctx, pc, l, Fp8Gemm::qkv, s, dqkv, &dy1, accumulate);
  Tensor gLn1 = grad_for_adding(ctx, p.ln1, accumulate);
  // dx += d(x) through the norm: block l - 1's w2 layer reads this dx first (its dy).
  Fp8ProducerAmax below_amax = fp8_w2_grad_amax_from_above(l - 1) ? fp8_grad_amax(l - 1, Fp8Gemm::w2) : Fp8ProducerAmax{};
  norm_backward(pc, ctx, s.x, W(p.ln1), s.rstd1, dy1, dx, gLn1, true, below_amax.out());
  notify(pc, p.ln1);
  s = BlockActivations{};
}

}  // namespace lmscale::model
