// ops::moe_*: shape, dtype and device checks, then the CPU implementation (cpu/moe_cpu.h). The
// mixture-of-experts GPU path is a later phase: CUDA tensors are refused here (docs/moe.md).
#include "checks.h"
#include "cpu/moe_cpu.h"
#include "lmscale/ops/moe.h"

namespace lmscale::ops {
namespace {

void cpu_only(const char* op, Device dev) {
  LMSCALE_CHECK(dev == Device::cpu, "{}: the mixture-of-experts GPU path is not in this version (CPU tensors only)", op);
}

void check_slot(const char* op, const Tensor& slot, std::int64_t N) {
  detail::check_dtype(op, "slot", slot, DType::i32);
  LMSCALE_CHECK(slot.ndim() == 2 && slot.dim(0) == N, "{}: slot must be [{}, k], got {}", op, N, shape_str(slot.shape()));
}

}  // namespace

void moe_route(Context& ctx, const Tensor& logits, Tensor& probs, Tensor& lse, Tensor& experts, Tensor& gates) {
  constexpr const char* op = "ops::moe_route";
  cpu_only(op, detail::common_device(op, {{"logits", &logits}, {"probs", &probs}, {"lse", &lse}, {"experts", &experts},
                                          {"gates", &gates}}));
  LMSCALE_CHECK(logits.ndim() == 2, "{}: logits must be [N, E], got {}", op, shape_str(logits.shape()));
  const std::int64_t N = logits.dim(0), E = logits.dim(1);
  detail::check_floating(op, "logits", logits);
  detail::check_shape(op, "probs", probs, {N, E});
  detail::check_shape(op, "lse", lse, {N});
  detail::check_dtype(op, "experts", experts, DType::i32);
  LMSCALE_CHECK(experts.ndim() == 2 && experts.dim(0) == N && experts.dim(1) >= 1 && experts.dim(1) <= E,
                "{}: experts must be [{}, k] with 1 <= k <= {}, got {}", op, N, E, shape_str(experts.shape()));
  detail::check_shape(op, "gates", gates, experts.shape());
  for (const auto& [name, t] : {detail::NamedTensor{"probs", &probs}, {"lse", &lse}, {"gates", &gates}})
    detail::check_same_dtype(op, "logits", logits, name, *t);
  cpu::moe_route(ctx, logits, probs, lse, experts, gates);
}

void moe_plan(Context& ctx, const Tensor& experts, std::int64_t group, std::int64_t capacity, Tensor& slot,
              Tensor& kept, Tensor& routed) {
  constexpr const char* op = "ops::moe_plan";
  cpu_only(op, detail::common_device(op, {{"experts", &experts}, {"slot", &slot}, {"kept", &kept}, {"routed", &routed}}));
  detail::check_dtype(op, "experts", experts, DType::i32);
  LMSCALE_CHECK(experts.ndim() == 2, "{}: experts must be [N, k], got {}", op, shape_str(experts.shape()));
  LMSCALE_CHECK(capacity >= 0, "{}: capacity {} < 0", op, capacity);
  LMSCALE_CHECK(group >= 1 && experts.dim(0) % group == 0, "{}: {} rows are not whole groups of {}", op,
                experts.dim(0), group);
  detail::check_shape(op, "slot", slot, experts.shape());
  detail::check_dtype(op, "slot", slot, DType::i32);
  detail::check_dtype(op, "kept", kept, DType::i32);
  detail::check_dtype(op, "routed", routed, DType::i32);
  LMSCALE_CHECK(kept.ndim() == 1 && routed.shape() == kept.shape(), "{}: kept and routed must be [E], got {} and {}", op,
                shape_str(kept.shape()), shape_str(routed.shape()));
  cpu::moe_plan(ctx, experts, group, capacity, slot, kept, routed);
}

void moe_gather(Context& ctx, const Tensor& x, const Tensor& slot, Tensor& xe) {
  constexpr const char* op = "ops::moe_gather";
  cpu_only(op, detail::common_device(op, {{"x", &x}, {"slot", &slot}, {"xe", &xe}}));
  LMSCALE_CHECK(x.ndim() == 2 && xe.ndim() == 2 && xe.dim(1) == x.dim(1), "{}: x [N, d] and xe [M, d], got {} and {}", op,
                shape_str(x.shape()), shape_str(xe.shape()));
  check_slot(op, slot, x.dim(0));
  detail::check_same_dtype(op, "x", x, "xe", xe);
  cpu::moe_gather(ctx, x, slot, xe);
}

void moe_gather_backward(Context& ctx, const Tensor& dxe, const Tensor& slot, Tensor& dx, bool accumulate) {
  constexpr const char* op = "ops::moe_gather_backward";
  cpu_only(op, detail::common_device(op, {{"dxe", &dxe}, {"slot", &slot}, {"dx", &dx}}));
  LMSCALE_CHECK(dx.ndim() == 2 && dxe.ndim() == 2 && dxe.dim(1) == dx.dim(1), "{}: dx [N, d] and dxe [M, d], got {} and {}",
                op, shape_str(dx.shape()), shape_str(dxe.shape()));
  check_slot(op, slot, dx.dim(0));
  detail::check_same_dtype(op, "dx", dx, "dxe", dxe);
  cpu::moe_gather_backward(ctx, dxe, slot, dx, accumulate);
}

void moe_combine(Context& ctx, const Tensor& ye, const Tensor& slot, const Tensor& gates, Tensor& out) {
  constexpr const char* op = "ops::moe_combine";
  cpu_only(op, detail::common_device(op, {{"ye", &ye}, {"slot", &slot}, {"gates", &gates}, {"out", &out}}));
  LMSCALE_CHECK(out.ndim() == 2 && ye.ndim() == 2 && ye.dim(1) == out.dim(1), "{}: out [N, d] and ye [M, d], got {} and {}",
                op, shape_str(out.shape()), shape_str(ye.shape()));
  check_slot(op, slot, out.dim(0));
  detail::check_shape(op, "gates", gates, slot.shape());
  detail::check_same_dtype(op, "out", out, "ye", ye);
  detail::check_same_dtype(op, "out", out, "gates", gates);
  cpu::moe_combine(ctx, ye, slot, gates, out);
}

void moe_combine_backward(Context& ctx, const Tensor& dout, const Tensor& ye, const Tensor& slot, const Tensor& gates,
                          Tensor& dye, Tensor& dgates) {
  constexpr const char* op = "ops::moe_combine_backward";
  cpu_only(op, detail::common_device(op, {{"dout", &dout}, {"ye", &ye}, {"slot", &slot}, {"gates", &gates}, {"dye", &dye},
                                          {"dgates", &dgates}}));
  LMSCALE_CHECK(dout.ndim() == 2 && ye.ndim() == 2 && ye.dim(1) == dout.dim(1), "{}: dout [N, d] and ye [M, d], got {} and {}",
                op, shape_str(dout.shape()), shape_str(ye.shape()));
  check_slot(op, slot, dout.dim(0));
  detail::check_shape(op, "gates", gates, slot.shape());
  detail::check_shape(op, "dgates", dgates, slot.shape());
  detail::check_shape(op, "dye", dye, ye.shape());
  for (const auto& [name, t] : {detail::NamedTensor{"ye", &ye}, {"gates", &gates}, {"dye", &dye}, {"dgates", &dgates}})
    detail::check_same_dtype(op, "dout", dout, name, *t);
  cpu::moe_combine_backward(ctx, dout, ye, slot, gates, dye, dgates);
}

void moe_router_losses(Context& ctx, const Tensor& probs, const Tensor& lse, const Tensor& experts, std::int64_t T,
                       double aux_coef, double z_coef, Tensor& terms) {
  constexpr const char* op = "ops::moe_router_losses";
  cpu_only(op, detail::common_device(op, {{"probs", &probs}, {"lse", &lse}, {"experts", &experts}, {"terms", &terms}}));
  LMSCALE_CHECK(probs.ndim() == 2, "{}: probs must be [N, E], got {}", op, shape_str(probs.shape()));
  const std::int64_t N = probs.dim(0);
  LMSCALE_CHECK(T >= 1 && N % T == 0, "{}: {} rows are not whole sequences of {} tokens", op, N, T);
  detail::check_shape(op, "lse", lse, {N});
  detail::check_dtype(op, "experts", experts, DType::i32);
  LMSCALE_CHECK(experts.ndim() == 2 && experts.dim(0) == N, "{}: experts must be [{}, k]", op, N);
  detail::check_shape(op, "terms", terms, {3});
  detail::check_same_dtype(op, "probs", probs, "lse", lse);
  detail::check_same_dtype(op, "probs", probs, "terms", terms);
  cpu::moe_router_losses(ctx, probs, lse, experts, T, aux_coef, z_coef, terms);
}

void moe_route_backward(Context& ctx, const Tensor& probs, const Tensor& lse, const Tensor& experts,
                        const Tensor& gates, const Tensor& dgates, std::int64_t T, double aux_coef, double z_coef,
                        double scale, Tensor& dlogits) {
  constexpr const char* op = "ops::moe_route_backward";
  cpu_only(op, detail::common_device(op, {{"probs", &probs}, {"lse", &lse}, {"experts", &experts}, {"gates", &gates},
                                          {"dgates", &dgates}, {"dlogits", &dlogits}}));
  LMSCALE_CHECK(probs.ndim() == 2, "{}: probs must be [N, E], got {}", op, shape_str(probs.shape()));
  const std::int64_t N = probs.dim(0);
  LMSCALE_CHECK(T >= 1 && N % T == 0, "{}: {} rows are not whole sequences of {} tokens", op, N, T);
  detail::check_shape(op, "lse", lse, {N});
  detail::check_dtype(op, "experts", experts, DType::i32);
  LMSCALE_CHECK(experts.ndim() == 2 && experts.dim(0) == N, "{}: experts must be [{}, k]", op, N);
  detail::check_shape(op, "gates", gates, experts.shape());
  detail::check_shape(op, "dgates", dgates, experts.shape());
  detail::check_shape(op, "dlogits", dlogits, probs.shape());
  for (const auto& [name, t] : {detail::NamedTensor{"lse", &lse}, {"gates", &gates}, {"dgates", &dgates}, {"dlogits", &dlogits}})
    detail::check_same_dtype(op, "probs", probs, name, *t);
  cpu::moe_route_backward(ctx, probs, lse, experts, gates, dgates, T, aux_coef, z_coef, scale, dlogits);
}

}  // namespace lmscale::ops
