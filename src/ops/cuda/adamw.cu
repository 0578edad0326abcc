// AdamW over one flat fp32 buffer on CUDA, in one launch (docs/architecture.md §2):
//   g = grad * grad_scale;  p -= lr*wd*p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= step_size * m / (sqrt(v) + eps),  step_size = lr * sqrt(1-b2^t) / (1-b1^t)
// with the bias corrections computed once in double on the host, and the bf16/fp16 working copy
// written in the same pass. 8 parameters per chunk (two 16-byte loads per fp32 array), two chunks
// per thread and iteration whose 16 loads are all issued before the first update: over 2e9
// parameters on an H200 one chunk at a time took 16.40 ms (3.66 TB/s), two 15.14 ms (3.96 TB/s),
// where a device-to-device memcpy moves 4.28 TB/s (docs/gpu.md). Not better (a probe on one H200,
// 2026-11-28, 2e9 parameters, best of 10): four chunks 17.18 ms (3.49 TB/s); streaming (.cs) loads
// and stores 15.19 ms, with 8 blocks per SM 15.26 ms.
// Bytes per parameter: 16 read (p, g, m, v) + 12 written (p, m, v) + 2 (16-bit copy).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "adamw_device.cuh"
#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

using namespace adamw_device;

template <class Low, class Grads>
__global__ void adamw_kernel(float* __restrict__ param, const Grads grads, float* __restrict__ m,
                             float* __restrict__ v, Low* __restrict__ low, std::int64_t n, std::int64_t chunks,
                             AdamWScalars s, DeviceStep dev) {
  if (!step_scalars(dev, s)) return;
  const std::int64_t i0 = thread_index(), step = thread_stride();
  // kUnroll chunks per thread and iteration (blockDim.x apart), all loaded before the first is
  // updated: 3.66 -> 3.96 TB/s over 2e9 parameters on an H200 (memcpy: 4.28), see the header.
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x;
  for (std::int64_t c = first; c < chunks; c += step * kUnroll) {
    float p[kUnroll][kChunk], g[kUnroll][kChunk], mm[kUnroll][kChunk], vv[kUnroll][kChunk];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t cu = c + static_cast<std::int64_t>(u) * blockDim.x;
      if (cu >= chunks) continue;
      const std::int64_t o = cu * kChunk;
      load_chunk(param + o, p[u]);
      load_chunk(grads.chunk(cu), g[u]);
      load_chunk(m + o, mm[u]);
      load_chunk(v + o, vv[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t o = (c + static_cast<std::int64_t>(u) * blockDim.x) * kChunk;
      if (o >= chunks * kChunk) continue;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) adamw_update(p[u][e], g[u][e], mm[u][e], vv[u][e], s);
      store_chunk(param + o, p[u]);
      store_chunk(m + o, mm[u]);
      store_chunk(v + o, vv[u]);
      if constexpr (!std::is_void_v<Low>) store_chunk(low + o, p[u]);
    }
  }
  if constexpr (std::is_same_v<Grads, OneGrad>) {
    for (std::int64_t i = chunks * kChunk + i0; i < n; i += step) {
      float p = param[i], mm = m[i], vv = v[i];
      adamw_update(p, grads.grad[i], mm, vv, s);
      param[i] = p;
      m[i] = mm;
      v[i] = vv;
      if constexpr (!std::is_void_v<Low>) low[i] = from_f32<Low>(p);
    }
  }
}

// One launch over n elements of p, m, v (and low) with the gradients from `grads`.
template <class Grads>
void launch(Context& ctx, float* p, const Grads& grads, float* mp, float* vp, Tensor* param_lowp, std::int64_t low_offset,
            std::int64_t n, std::int64_t chunks, const AdamWScalars& s, const DeviceStep& dev) {
  const unsigned grid = grid_for(std::max<std::int64_t>((chunks + kUnroll - 1) / kUnroll, n - chunks * kChunk), kThreads,
                                 resources(ctx).num_sms, 4);
  if (!param_lowp) {
    adamw_kernel<void><<<grid, kThreads, 0, stream(ctx)>>>(p, grads, mp, vp, nullptr, n, chunks, s, dev);
  } else if (param_lowp->dtype() == DType::bf16) {
    adamw_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream(ctx)>>>(
        p, grads, mp, vp, param_lowp->data_as<__nv_bfloat16>() + low_offset, n, chunks, s, dev);
  } else if (param_lowp->dtype() == DType::f16) {
    adamw_kernel<__half><<<grid, kThreads, 0, stream(ctx)>>>(p, grads, mp, vp, param_lowp->data_as<__half>() + low_offset,
                                                             n, chunks, s, dev);
  } else {
    throw Error(fmt::format("adamw: param_lowp is {}, expected bf16 or fp16", dtype_name(param_lowp->dtype())));
  }
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void adamw(Context& ctx, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& a,
           Tensor* param_lowp) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&param, &grad, &m, &v})
    LMSCALE_CHECK(t->dtype() == DType::f32 && t->numel() == param.numel(),
                  "adamw: param, grad, m, v must be fp32 of one size on CUDA");
  LMSCALE_CHECK(!param_lowp || param_lowp->numel() == param.numel(), "adamw: param_lowp size");
  LMSCALE_CHECK(a.step >= 1, "adamw: step {} (1-based)", a.step);
  const std::int64_t n = param.numel();
  if (n == 0) return;
  const bool aligned = is_aligned16(param.data()) && is_aligned16(grad.data()) && is_aligned16(m.data()) &&
                       is_aligned16(v.data()) && (!param_lowp || is_aligned16(param_lowp->data()));
  launch(ctx, param.data_as<float>(), OneGrad{grad.data_as<const float>()}, m.data_as<float>(), v.data_as<float>(),
         param_lowp, 0, n, aligned ? n / kChunk : 0, scalars(a), device_step(a));
}

bool adamw_pieces(Context& ctx, Tensor& param, const std::vector<GradPiece>& pieces, Tensor& m, Tensor& v,
                  const AdamWStep& a, Tensor* param_lowp) {
  const std::int64_t n = param.numel();
  bool ok = n > 0 && n % kChunk == 0 && param.dtype() == DType::f32 && m.dtype() == DType::f32 &&
            v.dtype() == DType::f32 && m.device() == Device::cuda && v.device() == Device::cuda &&
            is_aligned16(param.data()) && is_aligned16(m.data()) && is_aligned16(v.data()) &&
            (!param_lowp || (param_lowp->device() == Device::cuda && is_aligned16(param_lowp->data()) &&
                             (param_lowp->dtype() == DType::bf16 || param_lowp->dtype() == DType::f16)));
  for (const GradPiece& piece : pieces)
    ok = ok && piece.grad.device() == Device::cuda && piece.grad.dtype() == DType::f32 && piece.offset % kChunk == 0 &&
         piece.grad.numel() % kChunk == 0 && is_aligned16(piece.grad.data());
  if (!ok) return false;
  LMSCALE_CHECK(a.step >= 1, "adamw: step {} (1-based)", a.step);
  const AdamWScalars s = scalars(a);
  const DeviceStep dev = device_step(a);
  float* p = param.data_as<float>();
  float* mp = m.data_as<float>();
  float* vp = v.data_as<float>();
  for (std::size_t first = 0; first < pieces.size(); first += kMaxPieces) {
    const std::size_t count = std::min<std::size_t>(kMaxPieces, pieces.size() - first);
    const std::int64_t begin = pieces[first].offset;   // elements
    GradPieces table{};
    table.count = static_cast<int>(count);
    std::int64_t end = begin;
    for (std::size_t i = 0; i < count; ++i) {
      const GradPiece& piece = pieces[first + i];
      table.first_chunk[i] = (piece.offset - begin) / kChunk;
      table.grad[i] = piece.grad.data_as<const float>();
      end = piece.offset + piece.grad.numel();
    }
    const std::int64_t len = end - begin;
    launch(ctx, p + begin, table, mp + begin, vp + begin, param_lowp, begin, len, len / kChunk, s, dev);
  }
  return true;
}

void adamw_upload_scalars(Context& ctx, const AdamWStep& a, Tensor& scalars_out) {
  LMSCALE_CHECK(scalars_out.device() == Device::cuda && scalars_out.dtype() == DType::f32 &&
                    scalars_out.numel() == kAdamWScalars,
                "adamw_upload_scalars: the target must be f32 [{}] on the GPU", kAdamWScalars);
  const AdamWScalars s = scalars(a);
  // From pageable memory: returns once `s` is staged, so the stack variable may go.
  LMSCALE_CUDA_CHECK(cudaMemcpyAsync(scalars_out.data(), &s, sizeof s, cudaMemcpyHostToDevice, stream(ctx)));
}

}  // namespace lmscale::ops::cuda