// The mixture-of-experts FFN of an MoE block (docs/moe.md; transformer.h, "Mixture of experts").
// Forward, on y2 [N,d] (N = B*T rows):
//   router logits y2 Wr^T [N,E] -> softmax, top-k, renormalised gates (ops::moe_route)
//   -> dispatch plan with the per-sequence capacity (ops::moe_plan) -> xe [M,d] in expert order
//   -> [expert parallelism: counts, then rows, all-to-all to the experts' ranks; received rows
//      reordered expert-major]
//   -> per local expert e: ye_e = w2_e (silu(w1_e x) * w3_e x)
//   -> [all-to-all back] -> out[n] = sum_j gate[n,j] ye[slot[n,j]] (ops::moe_combine).
// The backward runs the same path in reverse; the router's gradient comes from the gates, the
// balance loss and the z-loss (ops::moe_route_backward). The model never communicates itself:
// the all-to-alls are ParallelContext::ep's callbacks (model/expert_parallel.h).
#include <algorithm>
#include <numeric>
#include <optional>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/moe.h"
#include "lmscale/ops/moe_experts.h"
#include "lmscale/ops/ops.h"

namespace lmscale::model {

namespace {

void notify(const ParallelContext& pc, int i) {
  if (pc.on_grad_ready) pc.on_grad_ready(i);
}

// Matrix i of a stacked [n, rows, cols] tensor as a [rows, cols] view.
Tensor matrix(const Tensor& t, std::int64_t i) { return t.slice(i, i + 1).reshape({t.dim(1), t.dim(2)}); }

// Int32 counts [n] as host integers (the host sizes the expert buffers from them).
std::vector<std::int64_t> host_counts(Context& ctx, const Tensor& t) {
  Tensor h = t;
  if (t.device() != Device::cpu) {
    h = Tensor::empty(t.shape(), DType::i32, *ctx.host, "moe_counts");
    ops::copy(ctx, t, h);
  }
  const std::int32_t* p = h.data_as<std::int32_t>();
  return std::vector<std::int64_t>(p, p + t.numel());
}

std::int64_t sum(const std::vector<std::int64_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t{0}); }

// The permutation from the received order (source rank, then local expert) to expert-major rows:
// perm[i] = the expert-major row of received row i. recv[src * El + e] rows from src for expert e.
Tensor received_to_expert_major(Context& ctx, const std::vector<std::int64_t>& recv, std::int64_t ep, std::int64_t El,
                                std::vector<std::int64_t>& expert_rows) {
  expert_rows.assign(static_cast<std::size_t>(El), 0);
  for (std::int64_t r = 0; r < ep; ++r)
    for (std::int64_t e = 0; e < El; ++e) expert_rows[static_cast<std::size_t>(e)] += recv[static_cast<std::size_t>(r * El + e)];
  std::vector<std::int64_t> next(static_cast<std::size_t>(El), 0);
  for (std::int64_t e = 1; e < El; ++e)
    next[static_cast<std::size_t>(e)] = next[static_cast<std::size_t>(e - 1)] + expert_rows[static_cast<std::size_t>(e - 1)];
  Tensor perm = Tensor::empty({sum(expert_rows), 1}, DType::i32, *ctx.host, "moe_plan");
  std::int32_t* p = perm.data_as<std::int32_t>();
  std::int64_t i = 0;
  for (std::int64_t r = 0; r < ep; ++r)
    for (std::int64_t e = 0; e < El; ++e)
      for (std::int64_t c = 0; c < recv[static_cast<std::size_t>(r * El + e)]; ++c)
        p[i++] = static_cast<std::int32_t>(next[static_cast<std::size_t>(e)]++);
  if (ctx.device == Device::cpu) return perm;
  Tensor dev = Tensor::empty(perm.shape(), DType::i32, *ctx.allocator, "moe_plan");
  ops::copy(ctx, perm, dev);
  return dev;
}

}  // namespace

void TransformerLM::reset_moe_stats() {
  moe_stats_.clear();
  moe_terms_ = Tensor();
  for (int l = 0; l < dims_.layers; ++l)
    if (dims_.is_moe_block(l)) {
      MoeLayerStats st;
      st.layer = l;
      st.routed.assign(static_cast<std::size_t>(dims_.moe_experts), 0);
      st.kept.assign(static_cast<std::size_t>(dims_.moe_experts), 0);
      moe_stats_.push_back(std::move(st));
    }
}

void TransformerLM::record_moe_stats(Context& ctx, int l, const BlockActivations& s, const Tensor& terms) {
  auto it = std::find_if(moe_stats_.begin(), moe_stats_.end(), [l](const MoeLayerStats& st) { return st.layer == l; });
  LMSCALE_CHECK(it != moe_stats_.end(), "block {} is not an MoE block", l);
  for (std::size_t i = 0; i < s.moe.routed.size(); ++i) it->routed[i] += s.moe.routed[i];
  for (std::size_t i = 0; i < s.moe.kept.size(); ++i) it->kept[i] += s.moe.kept[i];
  it->tokens += s.moe.experts.dim(0);
  if (!moe_terms_.defined()) {
    moe_terms_ = Tensor::empty({static_cast<std::int64_t>(moe_stats_.size()), 2}, terms.dtype(), *ctx.allocator,
                               "moe_stats");
    ops::fill(ctx, moe_terms_, 0.0);
  }
  const std::int64_t row = it - moe_stats_.begin();
  Tensor sums = moe_terms_.slice(row, row + 1).reshape({2});
  ops::add(ctx, sums, terms.slice(0, 2), sums);
}

const std::vector<MoeLayerStats>& TransformerLM::moe_stats(Context& ctx) {
  if (!moe_terms_.defined()) return moe_stats_;   // nothing recorded since the reset
  Tensor t = moe_terms_;
  if (t.device() != Device::cpu) {
    t = Tensor::empty(moe_terms_.shape(), moe_terms_.dtype(), *ctx.host, "moe_counts");
    ops::copy(ctx, moe_terms_, t);   // waits for the device
  }
  for (std::size_t i = 0; i < moe_stats_.size(); ++i) {
    const auto at = static_cast<std::int64_t>(2 * i);
    moe_stats_[i].balance_sum = t.dtype() == DType::f64 ? t.data_as<double>()[at] : t.data_as<float>()[at];
    moe_stats_[i].z_sum = t.dtype() == DType::f64 ? t.data_as<double>()[at + 1] : t.data_as<float>()[at + 1];
  }
  return moe_stats_;
}

Tensor TransformerLM::moe_ffn_forward(Context& ctx, int l, std::int64_t T, const Tensor& y2, BlockActivations& s,
                                      const ParallelContext& pc) {
  NvtxRange range("moe_ffn");
  const std::int64_t N = y2.dim(0), d = dims_.d_model, E = dims_.moe_experts, k = dims_.moe_top_k, Fe = dims_.moe_dff;
  const std::int64_t ep = ep_.degree, El = ep_.local(E);
  LMSCALE_CHECK(ep == 1 || pc.ep.active(), "block {}: the store holds {} of {} experts but no expert-parallel "
                "all-to-all was given (ParallelContext::ep)", l, El, E);
  Allocator& A = *ctx.allocator;
  const BlockParams p = block_params(l);
  MoeActivations& m = s.moe;
  m = MoeActivations{};
  // One trace range per phase (router, dispatch, experts, combine), so a run.trace shows where the
  // block's time goes; emplace ends the previous phase's range first.
  std::optional<NvtxRange> phase;
  phase.emplace("moe_router");
  // Router: logits [N,E] in the compute dtype; softmax and gates in the statistics dtype.
  Tensor logits = Tensor::empty({N, E}, compute_, A, "activations");
  ops::linear(ctx, y2, params_.compute_weight(p.router), logits);
  m.probs = Tensor::empty({N, E}, stats_, A, "activations");
  m.lse = Tensor::empty({N}, stats_, A, "activations");
  m.experts = Tensor::empty({N, k}, DType::i32, A, "activations");
  m.gates = Tensor::empty({N, k}, stats_, A, "activations");
  ops::moe_route(ctx, logits, m.probs, m.lse, m.experts, m.gates);
  logits = Tensor();
  // Dispatch plan: the capacity's group is one sequence (T rows).
  m.slot = Tensor::empty({N, k}, DType::i32, A, "activations");
  // kept [E] and routed [E] as the rows of one [2,E] buffer: one device-to-host copy (one wait
  // for the device) brings both to the host.
  const Tensor counts = Tensor::empty({2, E}, DType::i32, A, "activations");
  Tensor kept = counts.slice(0, 1).reshape({E}), routed = counts.slice(1, 2).reshape({E});
  ops::moe_plan(ctx, m.experts, T, dims_.expert_capacity(T), m.slot, kept, routed);
  const std::vector<std::int64_t> kept_routed = host_counts(ctx, counts);
  m.kept.assign(kept_routed.begin(), kept_routed.begin() + E);
  m.routed.assign(kept_routed.begin() + E, kept_routed.end());
  const std::int64_t M = sum(m.kept);
  phase.emplace("moe_dispatch");
  Tensor xt = Tensor::empty({M, d}, compute_, A, "activations");   // this rank's tokens' rows, expert order
  ops::moe_gather(ctx, y2, m.slot, xt);
  if (ep == 1) {
    m.xe = xt;
    m.expert_rows = m.kept;
  } else {
    // Counts first: rank r gets kept[e] of its experts e; then the rows themselves.
    std::vector<std::int64_t> recv;
    pc.ep.counts(m.kept, El, recv);
    m.send_rows.assign(static_cast<std::size_t>(ep), 0);
    m.recv_rows.assign(static_cast<std::size_t>(ep), 0);
    for (std::int64_t r = 0; r < ep; ++r)
      for (std::int64_t e = 0; e < El; ++e) {
        m.send_rows[static_cast<std::size_t>(r)] += m.kept[static_cast<std::size_t>(r * El + e)];
        m.recv_rows[static_cast<std::size_t>(r)] += recv[static_cast<std::size_t>(r * El + e)];
      }
    Tensor xr = Tensor::empty({sum(m.recv_rows), d}, compute_, A, "activations");
    pc.ep.rows(xt, m.send_rows, xr, m.recv_rows);
    xt = Tensor();
    m.perm = received_to_expert_major(ctx, recv, ep, El, m.expert_rows);
    m.xe = Tensor::empty({xr.dim(0), d}, compute_, A, "activations");
    ops::moe_gather(ctx, xr, m.perm, m.xe);
  }
  phase.emplace("moe_experts");
  // The local experts: a = w1_e x, b = w3_e x, g = silu(a) * b, ye = w2_e g, over each expert's rows.
  const std::int64_t Me = m.xe.dim(0);
  const Tensor ab = Tensor::empty({2, Me, Fe}, compute_, A, "activations");
  s.a = ab.slice(0, 1).reshape({Me, Fe});
  s.b = ab.slice(1, 2).reshape({Me, Fe});
  s.g = Tensor::empty({Me, Fe}, compute_, A, "activations");
  Tensor ye = Tensor::empty({Me, d}, compute_, A, "activations");
  ops::moe_experts(ctx, m.xe, m.expert_rows, params_.compute_weight(p.w1), params_.compute_weight(p.w3),
                   params_.compute_weight(p.w2), s.a, s.b, s.g, ye, dims_.moe_expert_gemm);
  phase.emplace("moe_combine");
  if (ep == 1) {
    m.ye = ye;
  } else {
    // Back to the received order, then to the tokens' ranks.
    Tensor yr = Tensor::empty({Me, d}, compute_, A, "activations");
    ops::moe_gather_backward(ctx, ye, m.perm, yr, false);   // yr[i] = ye[perm[i]]
    ye = Tensor();
    m.ye = Tensor::empty({M, d}, compute_, A, "activations");
    pc.ep.rows(yr, m.recv_rows, m.ye, m.send_rows);
  }
  Tensor out = Tensor::empty({N, d}, compute_, A, "activations");
  ops::moe_combine(ctx, m.ye, m.slot, m.gates, out);
  return out;
}

Tensor TransformerLM::moe_ffn_backward(Context& ctx, int l, std::int64_t T, BlockActivations& s, const Tensor& dout,
                                       const ParallelContext& pc, bool accumulate, double grad_scale) {
  const std::int64_t N = dout.dim(0), d = dims_.d_model, E = dims_.moe_experts, Fe = dims_.moe_dff;
  const std::int64_t ep = ep_.degree;
  Allocator& A = *ctx.allocator;
  const BlockParams p = block_params(l);
  MoeActivations& m = s.moe;
  const std::int64_t M = m.ye.dim(0), Me = m.xe.dim(0);
  std::optional<NvtxRange> phase;   // as in the forward
  phase.emplace("moe_combine_backward");
  // Combine: d(ye) on the token side, d(gates).
  Tensor dyt = Tensor::empty({M, d}, compute_, A, "activation_grads");
  Tensor dgates = Tensor::empty(m.gates.shape(), stats_, A, "activation_grads");
  ops::moe_combine_backward(ctx, dout, m.ye, m.slot, m.gates, dyt, dgates);
  m.ye = Tensor();
  Tensor dye = dyt;   // [Me,d] expert-major on the experts' rank
  if (ep > 1) {
    Tensor dyr = Tensor::empty({sum(m.recv_rows), d}, compute_, A, "activation_grads");
    pc.ep.rows(dyt, m.send_rows, dyr, m.recv_rows);
    dye = Tensor::empty({Me, d}, compute_, A, "activation_grads");
    ops::moe_gather(ctx, dyr, m.perm, dye);
  }
  dyt = Tensor();
  phase.emplace("moe_experts_backward");
  // The local experts' backward; a gradient of an expert without rows is zero (or unchanged).
  Tensor G1 = params_.grad(p.w1), G2 = params_.grad(p.w2), G3 = params_.grad(p.w3);
  Tensor dxe = Tensor::empty({Me, d}, compute_, A, "activation_grads");
  const Tensor dgab = Tensor::empty({3, Me, Fe}, compute_, A, "activation_grads");   // dg, da, db
  Tensor dg = matrix(dgab, 0), da = matrix(dgab, 1), db = matrix(dgab, 2);
  ops::moe_experts_backward(ctx, m.xe, m.expert_rows, params_.compute_weight(p.w1), params_.compute_weight(p.w3),
                            params_.compute_weight(p.w2), s.a, s.b, s.g, dye, dg, da, db, dxe, G1, G3, G2,
                            accumulate, dims_.moe_expert_gemm);
  notify(pc, p.w2);
  notify(pc, p.w1);
  notify(pc, p.w3);
  s.a = s.b = s.g = Tensor();
  m.xe = Tensor();
  dye = Tensor();
  phase.emplace("moe_dispatch_backward");
  Tensor dxt = dxe;   // [M,d] on the token side
  if (ep > 1) {
    Tensor dxr = Tensor::empty({Me, d}, compute_, A, "activation_grads");
    ops::moe_gather_backward(ctx, dxe, m.perm, dxr, false);   // back to the received order
    dxt = Tensor::empty({M, d}, compute_, A, "activation_grads");
    pc.ep.rows(dxr, m.recv_rows, dxt, m.send_rows);
  }
  dxe = Tensor();
  // Un-permute: dy2[n] = sum_j dxt[slot[n,j]]; then the router's share.
  Tensor dy2 = Tensor::empty({N, d}, compute_, A, "activation_grads");
  ops::moe_gather_backward(ctx, dxt, m.slot, dy2, false);
  dxt = Tensor();
  phase.emplace("moe_router_backward");
  Tensor dlogits = Tensor::empty({N, E}, compute_, A, "activation_grads");
  ops::moe_route_backward(ctx, m.probs, m.lse, m.experts, m.gates, dgates, T, dims_.moe_aux_loss, dims_.moe_z_loss,
                          grad_scale, dlogits);
  Tensor dyr = Tensor::empty({N, d}, compute_, A, "activation_grads");
  Tensor gR = params_.grad(p.router);
  ops::linear_backward(ctx, s.y2, params_.compute_weight(p.router), dlogits, &dyr, &gR, accumulate);
  notify(pc, p.router);
  ops::add(ctx, dy2, dyr, dy2);
  m = MoeActivations{};
  return dy2;
}

}  // namespace lmscale::model
