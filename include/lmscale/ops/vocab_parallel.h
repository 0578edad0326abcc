#pragma once
// Ops of the vocabulary-parallel embedding and LM head (tensor parallelism, docs/architecture.md §4): each of
// tp ranks holds rows [vocab_begin, vocab_begin + Vl) of the [V, d] embedding table and of the
// [V, d] LM head, so its logits are the columns [vocab_begin, vocab_begin + Vl) of the full
// [N, V] logits. The full logits are never gathered: the cross-entropy needs only two per-row
// statistics reduced over the tp ranks, the row max and the sum of exponentials (plus the target's
// logit, which lives on one rank). Three steps, with the caller's all-reduces between them:
//
//   vocab_parallel_max:  m[n] = max_j x[n, j] over the local columns    -> all-reduce (max)
//   vocab_parallel_sums: s[n] = (sum_j exp(x[n, j] - M[n]),             -> all-reduce (sum)
//                                x[n, t_n - vocab_begin] if local else 0)
//   vocab_parallel_loss: loss_sum = sum_n (log S[n] + M[n] - X_t[n])  (the full loss, on every rank)
//                        dlogits[n, j] = (exp(x[n, j] - M[n]) / S[n] - [j + vocab_begin == t_n]) * grad_scale
//
// With one rank (vocab_begin 0, Vl = V, the all-reduces identities) this is ops::cross_entropy.
// Statistics are fp32 (fp64 for fp64 logits). x is [N, Vl] in any float dtype; targets int32 [N]
// are global vocabulary ids; dlogits may alias logits.
#include <cstdint>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"

namespace lmscale::ops {

// out[n] = table[ids[n] - vocab_begin] when vocab_begin <= ids[n] < vocab_begin + Vl, else a zero
// row: the rank's partial lookup; the sum over the tp ranks is the full embedding.
void embedding_shard(Context& ctx, const Tensor& ids, const Tensor& table, std::int64_t vocab_begin, Tensor& out);
// dtable[ids[n] - vocab_begin] += dout[n] for the ids in this rank's range (accumulates;
// deterministic order as ops::embedding_backward).
void embedding_shard_backward(Context& ctx, const Tensor& ids, const Tensor& dout, std::int64_t vocab_begin,
                              Tensor& dtable);

// row_max [N] (stats dtype).
void vocab_parallel_max(Context& ctx, const Tensor& logits, Tensor& row_max);
// sums [N, 2] (stats dtype): (sum of exp(x - row_max), target logit or 0); row_max already reduced.
void vocab_parallel_sums(Context& ctx, const Tensor& logits, const Tensor& targets, std::int64_t vocab_begin,
                         const Tensor& row_max, Tensor& sums);
// loss_sum [1] (stats dtype) and, when dlogits is non-null, the gradient; row_max and sums reduced.
void vocab_parallel_loss(Context& ctx, const Tensor& logits, const Tensor& targets, std::int64_t vocab_begin,
                         const Tensor& row_max, const Tensor& sums, Tensor& loss_sum, Tensor* dlogits,
                         double grad_scale);

}  // namespace lmscale::ops
