// ops::moe_*: shape, dtype and device checks, then the CPU (cpu/moe_cpu.h) or the CUDA
// (cuda/moe_cuda.h) implementation. Dtypes: the activations (logits, rows, their gradients) in the
// compute dtype; the router's statistics (probs, lse, gates, dgates, terms) in its statistics dtype
// (detail::stats_dtype: fp32 for fp32, bf16 and fp16 activations, fp64 for fp64).
#include "lmscale/ops/moe.h"

#include "checks.h"
#include "cpu/moe_cpu.h"
#ifdef LMSCALE_WITH_CUDA
#include "cuda/moe_cuda.h"
#endif

namespace lmscale::ops {
namespace {

// `stats` must hold the statistics of activations of dtype `act.dtype()`.
void check_stats_dtype(const char* op, const char* act_name, const Tensor& act, const char* name, const Tensor& stats) {
  const DType want = detail::stats_dtype(act.dtype());
  LMSCALE_CHECK(stats.dtype() == want, "{}: '{}' is {} but '{}' is {}: the router statistics of {} activations are {}",
                op, act_name, dtype_name(act.dtype()), name, dtype_name(stats.dtype()), dtype_name(act.dtype()),
                dtype_name(want));
}

void check_slot(const char* op, const Tensor& slot, std::int64_t N) {
  detail::check_dtype(op, "slot", slot, DType::i32);
  LMSCALE_CHECK(slot.ndim() == 2 && slot.dim(0) == N, "{}: slot must be [{}, k], got {}", op, N,
                shape_str(slot.shape()));
}

}  // namespace

void moe_route(Context& ctx, const Tensor& logits, Tensor& probs, Tensor& lse, Tensor& experts, Tensor& gates) {
  constexpr const char* op = "ops::moe_route";
  const Device dev = detail::common_device(
      op, {{"logits", &logits}, {"probs", &probs}, {"lse", &lse}, {"experts", &experts}, {"gates", &gates}});
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
    check_stats_dtype(op, "logits", logits, name, *t);
  if (dev == Device::cpu) return cpu::moe_route(ctx, logits, probs, lse, experts, gates);
#ifdef LMSCALE_WITH_CUDA
  return cuda::moe_route(ctx, logits, probs, lse, experts, gates);
#else
  detail::no_cuda_build(op);
#endif
}

void moe_plan(Context& ctx, const Tensor& experts, std::int64_t group, std::int64_t capacity, Tensor& slot,
              Tensor& kept, Tensor& routed) {
  constexpr const char* op = "ops::moe_plan";
  const Device dev =
      detail::common_device(op, {{"experts", &experts}, {"slot", &slot}, {"kept", &kept}, {"routed", &routed}});
  detail::check_dtype(op, "experts", experts, DType::i32);
  LMSCALE_CHECK(experts.ndim() == 2, "{}: experts must be [N, k], got {}", op, shape_str(experts.shape()));
  LMSCALE_CHECK(capacity >= 0, "{}: capacity {} < 0", op, capacity);
  LMSCALE_CHECK(group >= 1 && experts.dim(0) % group == 0, "{}: {} rows are not whole groups of {}", op, experts.dim(0),
                group);
  detail::check_shape(op, "slot", slot, experts.shape());
  detail::check_dtype(op, "slot", slot, DType::i32);
  detail::check_dtype(op, "kept", kept, DType::i32);
  detail::check_dtype(op, "routed", routed, DType::i32);
  LMSCALE_CHECK(kept.ndim() == 1 && routed.shape() == kept.shape(), "{}: kept and routed must be [E], got {} and {}",
                op, shape_str(kept.shape()), shape_str(routed.shape()));
  if (dev == Device::cpu) return cpu::moe_plan(ctx, experts, group, capacity, slot, kept, routed);
#ifdef LMSCALE_WITH_CUDA
  return cuda::moe_plan(ctx, experts, group, capacity, slot, kept, routed);
#else
  detail::no_cuda_build(op);
#endif
}

void moe_gather(Context& ctx, const Tensor& x, const Tensor& slot, Tensor& xe) {
  constexpr const char* op = "ops::moe_gather";
  const Device dev = detail::common_device(op, {{"x", &x}, {"slot", &slot}, {"xe", &xe}});
  LMSCALE_CHECK(x.ndim() == 2 && xe.ndim() == 2 && xe.dim(1) == x.dim(1), "{}: x [N, d] and xe [M, d], got {} and {}",
                op, shape_str(x.shape()), shape_str(xe.shape()));
  check_slot(op, slot, x.dim(0));
  detail::check_same_dtype(op, "x", x, "xe", xe);
  if (dev == Device::cpu) return cpu::moe_gather(ctx, x, slot, xe);
#ifdef LMSCALE_WITH_CUDA
  return cuda::moe_gather(ctx, x, slot, xe);
#else
  detail::no_cuda_build(op);
#endif
}

void moe_gather_backward(Context& ctx, const Tensor& dxe, const Tensor& slot, Tensor& dx, bool accumulate) {
  constexpr const char* op = "ops::moe_gather_backward";
  const Device dev = detail::common_device(op, {{"dxe", &dxe}, {"slot", &slot}, {"dx", &dx}});
  LMSCALE_CHECK(dx.ndim() == 2 && dxe.ndim() == 2 && dxe.dim(1) == dx.dim(1),
                "{}: dx [N, d] and dxe [M, d], got {} and {}", op, shape_str(dx.shape()), shape_str(dxe.shape()));
  check_slot(op, slot, dx.dim(0));
  detail::check_same_dtype(op, "dx", dx, "dxe", dxe);
  if (dev == Device::cpu) return cpu::moe_gather_backward(ctx, dxe, slot, dx, accumulate);
#ifdef LMSCALE_WITH_CUDA
  return cuda::moe_gather_backward(ctx, dxe, slot, dx, accumulate);
#else
  detail::no_cuda_build(op);
#endif
}

void moe_combine(Context& ctx, const Tensor& ye, const Tensor& slot, const Tensor& gates, Tensor& out) {
  constexpr const char* op = "ops::moe_combine";
  const Device dev = detail::common_device(op, {{"ye", &ye}, {"slot", &slot}, {"gates", &gates}, {"out", &out}});
  LMSCALE_CHECK(out.ndim() == 2 && ye.ndim() == 2 && ye.dim(1) == out.dim(1),
                "{}: out [N, d] and ye [M, d], got {} and {}", op, shape_str(out.shape()), shape_str(ye.shape()));
  check_slot(op, slot, out.dim(0));
  detail::check_shape(op, "gates", gates, slot.shape());
  detail::check_same_dtype(op, "out", out, "ye", ye);
  check_stats_dtype(op, "out", out, "gates", gates);
  if (dev == Device::cpu) return cpu::moe_combine(ctx, ye, slot, gates, out);
#ifdef LMSCALE_WITH_CUDA
  return cuda::moe_combine(ctx, ye, slot, gates, out);
#else
  detail::no_cuda_build(op);
#endif
}

void moe_combine_backward(Context& ctx, const Tensor& dout, const Tensor& ye, const Tensor& slot, const Tensor& gates,
                          Tensor& dye, Tensor& dgates) {
  constexpr const char* op = "ops::moe_combine_backward";
  const Device dev = detail::common_device(
      op, {{"dout", &dout}, {"ye", &ye}, {"slot", &slot}, {"gates", &gates}, {"dye", &dye}, {"dgates", &dgates}});
  LMSCALE_CHECK(dout.ndim() == 2 && ye.ndim() == 2 && ye.dim(1) == dout.dim(1),
                "{}: dout [N, d] and ye [M, d], got {} and {}", op, shape_str(dout.shape()), shape_str(ye.shape()));
  check_slot(op, slot, dout.dim(0));
  detail::check_shape(op, "gates", gates, slot.shape());
  detail::check_shape(op, "dgates", dgates, slot.shape());
  detail::check_shape(op, "dye", dye, ye.shape());
  for (const auto& [name, t] : {detail::NamedTensor{"ye", &ye}, {"dye", &dye}})
    detail::check_same_dtype(op, "dout", dout, name, *t);
  check_stats_dtype(op, "dout", dout, "gates", gates);
  check_stats_dtype(op, "dout", dout, "dgates", dgates);
  if (dev == Device::cpu) return cpu::moe_combine_backward(ctx, dout, ye, slot, gates, dye, dgates);
#ifdef LMSCALE_WITH_CUDA
  return cuda::moe_combine_backward(ctx, dout, ye, slot, gates, dye, dgates);
#else
  detail::no_cuda_build(op);
#endif
}

void moe_router_losses(Context& ctx, const Tensor& probs, const Tensor& lse, const Tensor& experts, std::int64_t T,
                       double aux_coef, double z_coef, Tensor& terms) {
  constexpr const char* op = "ops::moe_router_losses";
  const Device dev =
      detail::common_device(op, {{"probs", &probs}, {"lse", &lse}, {"experts", &experts}, {"terms", &terms}});
  LMSCALE_CHECK(probs.ndim() == 2, "{}: probs must be [N, E], got {}", op, shape_str(probs.shape()));
  const std::int64_t N = probs.dim(0);
  LMSCALE_CHECK(T >= 1 && N % T == 0, "{}: {} rows are not whole sequences of {} tokens", op, N, T);
  detail::check_shape(op, "lse", lse, {N});
  detail::check_dtype(op, "experts", experts, DType::i32);
  LMSCALE_CHECK(experts.ndim() == 2 && experts.dim(0) == N, "{}: experts must be [{}, k]", op, N);
  detail::check_shape(op, "terms", terms, {3});
  detail::check_same_dtype(op, "probs", probs, "lse", lse);
  detail::check_same_dtype(op, "probs", probs, "terms", terms);
  if (dev == Device::cpu) return cpu::moe_router_losses(ctx, probs, lse, experts, T, aux_coef, z_coef, terms);
#ifdef LMSCALE_WITH_CUDA
  return cuda::moe_router_losses(ctx, probs, lse, experts, T, aux_coef, z_coef, terms);
#else
  detail::no_cuda_build(op);
#endif
}

void moe_route_backward(Context& ctx, const Tensor& probs, const Tensor& lse, const Tensor& experts,
                        const Tensor& gates, const Tensor& dgates, std::int64_t T, double aux_coef, double z_coef,
                        double scale, Tensor& dlogits) {
  constexpr const char* op = "ops::moe_route_backward";
  const Device dev = detail::common_device(op, {{"probs", &probs},
                                                {"lse", &lse},
                                                {"experts", &experts},
                                                {"gates", &gates},
                                                {"dgates", &dgates},
                                                {"dlogits", &dlogits}});
  LMSCALE_CHECK(probs.ndim() == 2, "{}: probs must be [N, E], got {}", op, shape_str(probs.shape()));
  const std::int64_t N = probs.dim(0);
  LMSCALE_CHECK(T >= 1 && N % T == 0, "{}: {} rows are not whole sequences of {} tokens", op, N, T);
  detail::check_shape(op, "lse", lse, {N});
  detail::check_dtype(op, "experts", experts, DType::i32);
  LMSCALE_CHECK(experts.ndim() == 2 && experts.dim(0) == N, "{}: experts must be [{}, k]", op, N);
  detail::check_shape(op, "gates", gates, experts.shape());
  detail::check_shape(op, "dgates", dgates, experts.shape());
  detail::check_shape(op, "dlogits", dlogits, probs.shape());
  for (const auto& [name, t] : {detail::NamedTensor{"lse", &lse}, {"gates", &gates}, {"dgates", &dgates}})
    detail::check_same_dtype(op, "probs", probs, name, *t);
  detail::check_floating(op, "dlogits", dlogits);
  check_stats_dtype(op, "dlogits", dlogits, "probs", probs);
  if (dev == Device::cpu)
    return cpu::moe_route_backward(ctx, probs, lse, experts, gates, dgates, T, aux_coef, z_coef, scale, dlogits);
#ifdef LMSCALE_WITH_CUDA
  return cuda::moe_route_backward(ctx, probs, lse, experts, gates, dgates, T, aux_coef, z_coef, scale, dlogits);
#else
  detail::no_cuda_build(op);
#endif
}

}  // namespace lmscale::ops
