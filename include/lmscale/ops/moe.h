#pragma once
// The routing math of a mixture-of-experts block (docs/moe.md), as ops over tensors, on CPU
// (src/ops/cpu/moe.cpp) and CUDA (src/ops/cuda/moe_*.cu). N token rows, d = d_model, E experts,
// k = top-k, M = assignments kept after the capacity. Index tensors are int32. The activations
// (logits, x, xe, ye, out and their gradients, dlogits) share the compute dtype: fp32 or fp64 on
// the CPU, fp32, bf16 or fp16 on CUDA; the router's statistics (probs, lse, gates, dgates, terms)
// are in its statistics dtype, fp32 (fp64 for fp64 activations). Integer outputs (experts, slot,
// kept, routed) are the same on both devices for the same inputs.
#include <cstdint>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"

namespace lmscale::ops {

// Router: probs[N,E] = softmax(logits[N,E]) (computed in the dtype, fp32 at least), lse[N] =
// logsumexp of each row, experts[N,k] = the k largest probabilities of each row in decreasing
// order, gates[N,k] = those probabilities divided by their sum (renormalised over the k).
// Tie-break, deterministic: of equal probabilities the lower expert index is chosen first.
void moe_route(Context& ctx, const Tensor& logits, Tensor& probs, Tensor& lse, Tensor& experts, Tensor& gates);

// Dispatch plan from experts[N,k] for E experts, the rows in groups of `group` consecutive rows
// (the model's groups are its sequences) and each expert taking at most `capacity` assignments
// of each group: within a group the assignments (n, j) queue per expert in token order n (then
// j); the first `capacity` of each queue are kept, the rest dropped (earlier tokens of a sequence
// win a full expert). The kept assignments are then numbered expert by expert, within an expert
// in token order: slot[N,k] = that row (0 .. M-1), -1 when dropped; kept[E] and routed[E] =
// assignments per expert after and before the capacity (sum kept = M).
void moe_plan(Context& ctx, const Tensor& experts, std::int64_t group, std::int64_t capacity, Tensor& slot,
              Tensor& kept, Tensor& routed);

// xe[M,d]: xe[slot[n,j]] = x[n] for every kept assignment (the permutation into expert order).
void moe_gather(Context& ctx, const Tensor& x, const Tensor& slot, Tensor& xe);
// Its backward: dx[n] (+)= sum over kept j of dxe[slot[n,j]] (accumulate: add to dx, else
// overwrite; a token with every assignment dropped gets 0).
void moe_gather_backward(Context& ctx, const Tensor& dxe, const Tensor& slot, Tensor& dx, bool accumulate);

// out[n] = sum over kept j of gates[n,j] * ye[slot[n,j]] (overwrites; 0 for a fully dropped token).
void moe_combine(Context& ctx, const Tensor& ye, const Tensor& slot, const Tensor& gates, Tensor& out);
// Its backward: dye[slot[n,j]] = gates[n,j] dout[n]; dgates[n,j] = <dout[n], ye[slot[n,j]]>
// (0 when dropped).
void moe_combine_backward(Context& ctx, const Tensor& dout, const Tensor& ye, const Tensor& slot, const Tensor& gates,
                          Tensor& dye, Tensor& dgates);

// The router losses over the N = B*T rows of B sequences of T tokens (terms [3], overwritten):
//   terms[0] = sum over sequences of (E / (T k)) sum_e P_e c_e     (load balance, Switch/GShard form
//              per sequence: P_e = sum of probs[t,e] over the sequence, c_e = assignments to e
//              before the capacity; T at perfect balance)
//   terms[1] = sum over rows of lse^2                               (z-loss)
//   terms[2] = aux_coef * terms[0] + z_coef * terms[1]             (what the model adds to its loss sum)
// Divided by the global token count, terms[0] and terms[1] are the mean per-sequence balance loss
// (1 at perfect balance) and the mean z-loss, independent of how sequences are split over ranks.
void moe_router_losses(Context& ctx, const Tensor& probs, const Tensor& lse, const Tensor& experts, std::int64_t T,
                       double aux_coef, double z_coef, Tensor& terms);

// The router's backward to its logits (overwrites dlogits[N,E]):
//   through the gates (g_j = p_{e_j} / S):  dp_{e_j} = (dgates_j - sum_i dgates_i g_i) / S
//   the balance loss, scale * aux_coef * terms[0]:  dp_{t,e} += scale * aux_coef * E c_e / (T k)
//   then softmax:                            dlogits = p * (dp - sum_e p dp)
//   the z-loss, scale * z_coef * terms[1]:   dlogits += scale * z_coef * 2 lse p
void moe_route_backward(Context& ctx, const Tensor& probs, const Tensor& lse, const Tensor& experts,
                        const Tensor& gates, const Tensor& dgates, std::int64_t T, double aux_coef, double z_coef,
                        double scale, Tensor& dlogits);

}  // namespace lmscale::ops
