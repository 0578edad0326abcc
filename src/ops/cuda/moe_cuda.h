#pragma once
// The CUDA implementations of the mixture-of-experts routing ops
// (lmscale/ops/moe.h), called by src/ops/moe.cpp after its checks, on the
// context's compute stream (nothing synchronises). Dtypes: the activations
// (logits, x, ye, dout, dlogits) fp32, bf16 or fp16; the router's statistics
// (probs, lse, gates, dgates, terms) fp32; index tensors int32. The router math
// (softmax, top-k, gates, the router's backward, the losses) runs in fp64 per
// row (E values, negligible next to the GEMMs), so probabilities and expert
// choices match the CPU reference's to fp32 rounding; the row movers accumulate
// in fp32. Limits checked here: E <= 1024 experts.
#include "lmscale/ops/moe.h"

namespace lmscale::ops::cuda {

void moe_route(Context& ctx, const Tensor& logits, Tensor& probs, Tensor& lse, Tensor& experts, Tensor& gates);
void moe_route_backward(Context& ctx, const Tensor& probs, const Tensor& lse, const Tensor& experts,
                        const Tensor& gates, const Tensor& dgates, std::int64_t T, double aux_coef, double z_coef,
                        double scale, Tensor& dlogits);
void moe_router_losses(Context& ctx, const Tensor& probs, const Tensor& lse, const Tensor& experts, std::int64_t T,
                       double aux_coef, double z_coef, Tensor& terms);
void moe_plan(Context& ctx, const Tensor& experts, std::int64_t group, std::int64_t capacity, Tensor& slot,
              Tensor& kept, Tensor& routed);
void moe_gather(Context& ctx, const Tensor& x, const Tensor& slot, Tensor& xe);
void moe_gather_backward(Context& ctx, const Tensor& dxe, const Tensor& slot, Tensor& dx, bool accumulate);
void moe_combine(Context& ctx, const Tensor& ye, const Tensor& slot, const Tensor& gates, Tensor& out);
void moe_combine_backward(Context& ctx, const Tensor& dout, const Tensor& ye, const Tensor& slot, const Tensor& gates,
                          Tensor& dye, Tensor& dgates);

}  // namespace lmscale::ops::cuda
