// The zero-bubble schedule's split backward in the allocation replay (memory_replay.h): a block's
// B pass with its weight-gradient products deferred (TransformerLM::block_backward with defer,
// TransformerLM::weight_grads) and the W pass that runs them (TransformerLM::backward_weights).
// What a deferred product keeps alive is what 1f1b's backward would have freed at once: per dense
// block the FFN's g [N,F] and the w2 GEMM's output gradient [N,d], y2 and the [2,N,F] da|db
// tensor, the attention's o [N,dl] and the output projection's gradient [N,d], y1 and the
// [3,N,dl] dq|dk|dv tensor. Without sequence parallelism the two output gradients are the
// residual stream's gradient dx, which the norms' backward then changes in place: the model
// copies them ([N,d] each). Under sequence parallelism they are the gathered [N,d] rows, and the
// products keep the gathered y1 and y2 [N,d] (the [Nl,d] shards die with the block).
#include "memory_replay.h"

namespace lmscale::jobs::replay {

namespace {

// TransformerLM::weight_grads with defer: the product's input (moved from the block, or a
// gathered copy) and output gradients (a copy of dx where they are dx) now belong to w.
void defer_product(DeferredWeights& w, double bytes, std::vector<int> params) {
  w.push_back({bytes, std::move(params)});
}

}  // namespace

void block_backward_deferred(Sim& m, const Shapes& s, Block& b, Grads& gr, int l, DeferredWeights& w) {
  const double Nde = s.N * s.d * s.e, Nlde = s.Nl * s.d * s.e, Ndle = s.N * s.dl * s.e, NFe = s.N * s.F * s.e;
  const model::BlockParams p = s.index().block(l);
  // The output gradient of w2 and o: sequence parallel, dx gathered into an [N,d] temporary (kept
  // by the product); otherwise dx itself, copied ([N,d]) since dx changes in place afterwards.
  auto output_grad = [&] { return m.alloc(Nde); };
  // The input of w1|w3 and q|k|v: sequence parallel, the norm output gathered again ([N,d], kept
  // by the product; the [Nl,d] shard is freed with the block); otherwise the block's own y.
  auto product_input = [&](double& y) {
    if (s.sp) return m.alloc(Nde);
    const double kept = y;
    y = 0;
    return kept;
  };
  if (s.is_moe(l)) {
    moe_backward(m, s, b, gr, l);   // an MoE block's FFN is not deferred
  } else {
    if (b.a <= 0) {   // selective-mlp: y2, a, b again
      recompute_norm(m, s, b.y2);
      ffn_inputs(m, s, b);
    }
    if (b.g <= 0) b.g = m.alloc(NFe);
    double dg = m.alloc(NFe);
    // w2: dg = dout w2 now; dW2 = dout^T g deferred (g and dout kept).
    const double dout = output_grad();
    defer_product(w, b.g + dout, {p.w2});
    b.g = 0;
    double dab = m.alloc(2 * NFe);   // da, db: one [2,N,F] tensor
    m.free(dg);
    m.free(b.a);
    m.free(b.b);
    recompute_norm(m, s, b.y2);
    double dy2 = m.alloc(Nde);
    gr.touch(p.w1, false);   // the B pass builds the gradient list (lazy buckets allocated), no write
    gr.touch(p.w3, false);
    // w1, w3: dy2 = da w1 + db w3 now; dW1, dW3 deferred (the input and da|db kept).
    const double y2 = product_input(b.y2);
    defer_product(w, y2 + dab, {p.w1, p.w3});
    dab = 0;
    if (s.sp) {   // f backward: reduce-scattered into a new [Nl,d]
      const double shard = m.alloc(Nlde);
      m.free(dy2);
      dy2 = shard;
    }
    gr.touch(p.ln2);
    m.free(b.y2);
    m.free(b.h);
    m.free(dy2);
  }
  double dO = m.alloc(Ndle);
  // o: dO = dproj wo now; dWo = dproj^T o deferred (o and dproj kept).
  const double dproj = output_grad();
  defer_product(w, b.o + dproj, {p.o});
  b.o = 0;
  double dqkv = attention_backward(m, s, b, dO);
  recompute_norm(m, s, b.y1);
  double dy1 = m.alloc(Nde);
  for (int i : {p.q, p.k, p.v}) gr.touch(i, false);
  const double y1 = product_input(b.y1);
  defer_product(w, y1 + dqkv, {p.q, p.k, p.v});
  dqkv = 0;
  if (s.sp) {
    const double shard = m.alloc(Nlde);
    m.free(dy1);
    dy1 = shard;
  }
  gr.touch(p.ln1);
  m.free(dy1);
  free_block(m, b);
}

void backward_weights(Sim& m, Grads& gr, DeferredWeights& w) {
  for (DeferredProduct& d : w) {
    for (int i : d.params) gr.touch(i, false);   // params_.grad(i): lazy buckets allocated
    for (int i : d.params) gr.ready(i);          // notify after the GEMM
    m.free(d.bytes);
  }
  w.clear();
}

}  // namespace lmscale::jobs::replay
