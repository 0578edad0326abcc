#pragma once
// Adds a linear op's matrix products to Context::linear_products (core/context.h), when set: the
// public ops count once, at dispatch, what they run (a strided batch of n counts n).
#include <cstdint>

#include "lmscale/core/context.h"

namespace lmscale::ops::detail {

inline void count_products(Context& ctx, std::int64_t forward, std::int64_t data_grad, std::int64_t weight_grad) {
  if (!ctx.linear_products) return;
  ctx.linear_products->forward += forward;
  ctx.linear_products->data_grad += data_grad;
  ctx.linear_products->weight_grad += weight_grad;
}

}  // namespace lmscale::ops::detail
