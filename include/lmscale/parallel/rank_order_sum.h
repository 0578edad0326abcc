#pragma once
// The copy-engine exchanges' reduction (zero2 and bucketed DDP, parallel.grad_exchange =
// copy-engine): a range's copies from every rank, added in rank order,
// out = ((t0 + t1) + t2) + ... + t(n-1), one fp32 addition at a time. With 2 ranks that is the one
// addition NCCL's reduce-scatter and all-reduce make (a + b = b + a), so the results are NCCL's bits;
// with more, every rank that sums a range gets the same bits.
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"
#include "lmscale/ops/ops.h"

namespace lmscale::parallel {

// terms: [n >= 2] same-size tensors in rank order. out may be one of them; partial sums go to
// `scratch`, which may be `out` itself when out is none of the terms, or a term that may be
// overwritten (it is read by the same elementwise add that overwrites it).
inline void sum_in_rank_order(Context& ctx, const std::vector<Tensor>& terms, Tensor& out, Tensor& scratch) {
  Tensor acc = terms.front();
  for (std::size_t q = 1; q < terms.size(); ++q) {
    Tensor& dst = q + 1 == terms.size() ? out : scratch;
    ops::add(ctx, acc, terms[q], dst);
    acc = dst;
  }
}

}  // namespace lmscale::parallel
