// The tensor-parallel points of the Transformer LM (model/tensor_parallel.h): Megatron's f and g
// around each sublayer, their sequence-parallel forms, the vocabulary-parallel embedding and the
// vocabulary-parallel cross-entropy. Everything here is an identity (or the plain op) when the
// tensor-parallel degree is 1, so the single-process model pays nothing.
// Shapes: N = B*T rows, Nl = N/tp under sequence parallelism (else N), d = d_model, Vl = V/tp.
#include <algorithm>

#include "lmscale/core/error.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/ops.h"
#include "lmscale/ops/vocab_parallel.h"

namespace lmscale::model {

namespace {
void need(const std::function<void(Tensor&)>& f, const char* what) {
  LMSCALE_CHECK(static_cast<bool>(f), "tensor parallel model without the tp {} callback (ParallelContext::tp)", what);
}
}  // namespace

std::int64_t TransformerLM::local_rows(std::int64_t N) const {
  if (!tp_.sequence_sharded()) return N;
  LMSCALE_CHECK(N % tp_.degree == 0, "sequence parallelism: {} token rows not divisible by tp = {}", N, tp_.degree);
  return N / tp_.degree;
}

Tensor TransformerLM::tp_f(const ParallelContext& pc, Context& ctx, const Tensor& y) {
  if (!tp_.sequence_sharded()) return y;   // f forward: identity
  LMSCALE_CHECK(static_cast<bool>(pc.tp.gather_rows), "sequence parallel model without the tp gather_rows callback");
  Tensor full = Tensor::empty({y.dim(0) * tp_.degree, y.dim(1)}, y.dtype(), *ctx.allocator, "activations");
  pc.tp.gather_rows(y, full);
  return full;
}

Tensor TransformerLM::tp_f_backward(const ParallelContext& pc, Context& ctx, Tensor& dy) {
  if (!tp_.active()) return dy;
  if (!tp_.sequence_sharded()) {   // f backward: all-reduce
    need(pc.tp.sum, "sum");
    pc.tp.sum(dy);
    return dy;
  }
  LMSCALE_CHECK(static_cast<bool>(pc.tp.scatter_rows), "sequence parallel model without the tp scatter_rows callback");
  Tensor shard = Tensor::empty({dy.dim(0) / tp_.degree, dy.dim(1)}, dy.dtype(), *ctx.allocator, "activation_grads");
  pc.tp.scatter_rows(dy, shard);
  return shard;
}

TransformerLM::PendingGrad TransformerLM::tp_f_backward_start(const ParallelContext& pc, Context& ctx, Tensor& dy) {
  PendingGrad p;
  if (tp_.active() && !tp_.sequence_sharded() && pc.tp.sum_async) {
    p.wait = pc.tp.sum_async(dy);   // in place: dy itself is the result
    p.result = dy;
  } else if (tp_.sequence_sharded() && pc.tp.scatter_rows_async) {
    p.result = Tensor::empty({dy.dim(0) / tp_.degree, dy.dim(1)}, dy.dtype(), *ctx.allocator, "activation_grads");
    p.wait = pc.tp.scatter_rows_async(dy, p.result);
    // dy (the send buffer) must outlive the collective: the waiter keeps it.
    p.wait = [w = std::move(p.wait), keep = dy]() { w(); };
  } else {
    p.result = tp_f_backward(pc, ctx, dy);
  }
  return p;
}

Tensor TransformerLM::tp_g(const ParallelContext& pc, Context& ctx, Tensor& partial) {
  if (!tp_.active()) return partial;
  if (!tp_.sequence_sharded()) {   // g forward: all-reduce
    need(pc.tp.sum, "sum");
    pc.tp.sum(partial);
    return partial;
  }
  LMSCALE_CHECK(static_cast<bool>(pc.tp.scatter_rows), "sequence parallel model without the tp scatter_rows callback");
  Tensor shard =
      Tensor::empty({partial.dim(0) / tp_.degree, partial.dim(1)}, partial.dtype(), *ctx.allocator, "activations");
  pc.tp.scatter_rows(partial, shard);
  return shard;
}

Tensor TransformerLM::tp_g_backward(const ParallelContext& pc, Context& ctx, const Tensor& d) {
  if (!tp_.sequence_sharded()) return d;   // g backward: identity
  LMSCALE_CHECK(static_cast<bool>(pc.tp.gather_rows), "sequence parallel model without the tp gather_rows callback");
  Tensor full = Tensor::empty({d.dim(0) * tp_.degree, d.dim(1)}, d.dtype(), *ctx.allocator, "activation_grads");
  pc.tp.gather_rows(d, full);
  return full;
}

void TransformerLM::norm_backward(const ParallelContext& pc, Context& ctx, const Tensor& x, const Tensor& w,
                                  const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw, bool accumulate_dx,
                                  Tensor* dx_amax) {
  if (!tp_.sequence_sharded()) return ops::rmsnorm_backward(ctx, x, w, rstd, dy, dx, dw, accumulate_dx, dx_amax);
  LMSCALE_CHECK(!dx_amax, "norm_backward: no producer amax under sequence parallelism (fp8 refuses tensor parallelism)");
  // Each rank saw only its rows: the weight gradient of this call [d] is a partial sum. It is
  // summed over tp here, per call, rather than once per step, so that gradient accumulation and
  // every data-parallel strategy see the same full gradient as without sequence parallelism
  // (2 all-reduces of d floats per block).
  need(pc.tp.sum, "sum");
  Tensor part = Tensor::empty({dw.numel()}, dw.dtype(), *ctx.allocator, "norm_grad");
  ops::fill(ctx, part, 0.0);
  ops::rmsnorm_backward(ctx, x, w, rstd, dy, dx, part, accumulate_dx);
  pc.tp.sum(part);
  Tensor flat = dw.reshape({dw.numel()});
  ops::add(ctx, flat, part, flat);
}

Tensor TransformerLM::embed(const ParallelContext& pc, Context& ctx, const Tensor& ids) {
  const std::int64_t N = ids.numel(), d = dims_.d_model;
  Tensor x = Tensor::empty({N, d}, compute_, *ctx.allocator, "activations");
  const Tensor table = params_.compute_weight(params_.local_index(0));   // [V,d] or [V/tp,d]
  if (!tp_.active()) {
    ops::embedding(ctx, ids, table, x);
    return x;
  }
  // Vocabulary-parallel: rows of ids outside this rank's range are zero; g sums the ranks' parts
  // (sequence parallel: reduce-scatter, so each rank keeps its rows).
  ops::embedding_shard(ctx, ids, table, tp_.begin(dims_.vocab), x);
  return tp_g(pc, ctx, x);
}

void TransformerLM::embed_backward(const ParallelContext& pc, Context& ctx, const Tensor& ids, const Tensor& dx,
                                   Tensor& dtable) {
  if (!tp_.active()) return ops::embedding_backward(ctx, ids, dx, dtable);
  const Tensor dfull = tp_g_backward(pc, ctx, dx);   // [N,d]
  ops::embedding_shard_backward(ctx, ids, dfull, tp_.begin(dims_.vocab), dtable);
}

void TransformerLM::loss(const ParallelContext& pc, Context& ctx, Tensor& logits, const Tensor& targets,
                         Tensor& loss_sum, bool keep, double grad_scale) {
  if (!tp_.active()) return ops::cross_entropy(ctx, logits, targets, loss_sum, keep ? &logits : nullptr, grad_scale);
  need(pc.tp.max, "max");
  need(pc.tp.sum, "sum");
  const std::int64_t N = logits.dim(0), vb = tp_.begin(dims_.vocab);
  Allocator& A = *ctx.allocator;
  Tensor row_max = Tensor::empty({N}, stats_, A, "loss_stats");
  Tensor sums = Tensor::empty({N, 2}, stats_, A, "loss_stats");
  ops::vocab_parallel_max(ctx, logits, row_max);
  pc.tp.max(row_max);                       // global row max: no overflow in exp on any rank
  ops::vocab_parallel_sums(ctx, logits, targets, vb, row_max, sums);
  pc.tp.sum(sums);                          // sum of exp over V, and the target's logit
  ops::vocab_parallel_loss(ctx, logits, targets, vb, row_max, sums, loss_sum, keep ? &logits : nullptr, grad_scale);
}

Tensor TransformerLM::head_chunks_tp(const ParallelContext& pc, Context& ctx, const Tensor& y, const Tensor& w,
                                     const Tensor& targets, Tensor& loss_sum, Tensor* dy, Tensor* dw,
                                     const HeadGrad* grad, std::int64_t chunk_rows) {
  const std::int64_t N = y.dim(0), d = y.dim(1), rows = std::min(chunk_rows, N);
  Allocator& A = *ctx.allocator;
  Tensor logits = Tensor::empty({rows, Vl_}, compute_, A, "logits");   // one chunk's [rows, Vl], reused
  Tensor part = rows < N ? Tensor::empty({1}, stats_, A, "loss") : Tensor();
  PendingGrad pending;
  for (std::int64_t r0 = 0; r0 < N; r0 += rows) {
    const std::int64_t n = std::min(rows, N - r0);
    const bool whole = n == N, last = r0 + n == N;
    const Tensor yc = whole ? y : y.flat_range(r0 * d, n * d).reshape({n, d});
    const Tensor tc = whole ? targets : targets.flat_range(r0, n);
    Tensor z = n == rows ? logits : logits.flat_range(0, n * Vl_).reshape({n, Vl_});
    ops::linear(ctx, yc, w, z);
    Tensor& l = r0 == 0 ? loss_sum : part;
    loss(pc, ctx, z, tc, l, grad != nullptr, grad ? grad->scale : 1.0);
    if (r0 > 0) ops::add(ctx, loss_sum, part, loss_sum);
    if (!grad) continue;
    // The input gradient first; after the last chunk's, its f-backward collective runs while the
    // weight-gradient GEMM (which does not read it) computes.
    Tensor dyc = whole ? *dy : dy->flat_range(r0 * d, n * d).reshape({n, d});
    ops::linear_backward(ctx, yc, w, z, &dyc, nullptr, false);
    if (last) pending = tp_f_backward_start(pc, ctx, *dy);
    ops::linear_backward(ctx, yc, w, z, nullptr, dw, grad->accumulate || r0 > 0);
  }
  return grad ? pending.finish() : Tensor();
}

}  // namespace lmscale::model
