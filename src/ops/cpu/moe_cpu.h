#pragma once
// The CPU implementations of the mixture-of-experts routing ops (lmscale/ops/moe.h), called by
// src/ops/moe.cpp after its checks. fp32 and fp64 (templates over float/double); row sums and the
// softmax's normaliser accumulate in double.
#include "lmscale/ops/moe.h"

namespace lmscale::ops::cpu {

void moe_route(Context& ctx, const Tensor& logits, Tensor& probs, Tensor& lse, Tensor& experts, Tensor& gates);
void moe_plan(Context& ctx, const Tensor& experts, std::int64_t group, std::int64_t capacity, Tensor& slot,
              Tensor& kept, Tensor& routed);
void moe_gather(Context& ctx, const Tensor& x, const Tensor& slot, Tensor& xe);
void moe_gather_backward(Context& ctx, const Tensor& dxe, const Tensor& slot, Tensor& dx, bool accumulate);
void moe_combine(Context& ctx, const Tensor& ye, const Tensor& slot, const Tensor& gates, Tensor& out);
void moe_combine_backward(Context& ctx, const Tensor& dout, const Tensor& ye, const Tensor& slot, const Tensor& gates,
                          Tensor& dye, Tensor& dgates);
void moe_router_losses(Context& ctx, const Tensor& probs, const Tensor& lse, const Tensor& experts, std::int64_t T,
                       double aux_coef, double z_coef, Tensor& terms);
void moe_route_backward(Context& ctx, const Tensor& probs, const Tensor& lse, const Tensor& experts,
                        const Tensor& gates, const Tensor& dgates, std::int64_t T, double aux_coef, double z_coef,
                        double scale, Tensor& dlogits);

}  // namespace lmscale::ops::cpu
