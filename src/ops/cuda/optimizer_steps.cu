// Momentum SGD, LAMB and the trust-ratio norms on CUDA (lmscale/ops/optimizer_steps.h), fp32
// master buffers. The updates are one pass each over a parameter's elements, 8 per thread and step
// when every buffer is 16-byte aligned (else the scalar path), writing the bf16/fp16 working copy
// in the same pass, like the AdamW kernel. Bytes per element: momentum 12 read + 8 written (+2),
// LAMB moments 12 + 8, LAMB update 12 + 4 (+2).
// The norms kernel is deterministic: span s is reduced by a fixed set of blocks (grid.y = span),
// each writing fp32 partial sums; the host adds them in double in a fixed order. No atomics.
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "cuda_ops.h"
#include "kernel_utils.cuh"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocksPerSpan = 64;

struct MomentumScalars {
  float momentum, weight_decay, grad_scale, coeff, step;
  bool nesterov;
};

__device__ __forceinline__ void momentum_element(float& p, float g, float& b, const MomentumScalars& s) {
  g = g * s.grad_scale + s.weight_decay * p;
  b = s.momentum * b + s.coeff * g;
  const float d = s.nesterov ? s.coeff * g + s.momentum * b : b;
  p -= s.step * d;
}

template <class Low>
__global__ void momentum_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ buf,
                                Low* __restrict__ low, std::int64_t n, std::int64_t chunks, MomentumScalars s) {
  const std::int64_t i0 = thread_index(), step = thread_stride();
  for (std::int64_t c = i0; c < chunks; c += step) {
    const std::int64_t o = c * kChunk;
    float p[kChunk], g[kChunk], b[kChunk];
    load_chunk(param + o, p);
    load_chunk(grad + o, g);
    load_chunk(buf + o, b);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) momentum_element(p[e], g[e], b[e], s);
    store_chunk(param + o, p);
    store_chunk(buf + o, b);
    if constexpr (!std::is_void_v<Low>) store_chunk(low + o, p);
  }
  for (std::int64_t i = chunks * kChunk + i0; i < n; i += step) {
    float p = param[i], b = buf[i];
    momentum_element(p, grad[i], b, s);
    param[i] = p;
    buf[i] = b;
    if constexpr (!std::is_void_v<Low>) low[i] = from_f32<Low>(p);
  }
}

struct LambScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, grad_scale;
  float inv_c1, inv_c2, eps, weight_decay, lr_ratio;
};

LambScalars lamb_scalars(const LambStep& a) {
  const double t = static_cast<double>(a.step);
  LambScalars s;
  s.beta1 = static_cast<float>(a.beta1);
  s.beta2 = static_cast<float>(a.beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - a.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - a.beta2);
  s.grad_scale = static_cast<float>(a.grad_scale);
  s.inv_c1 = static_cast<float>(1.0 / (1.0 - std::pow(a.beta1, t)));
  s.inv_c2 = static_cast<float>(1.0 / (1.0 - std::pow(a.beta2, t)));
  s.eps = static_cast<float>(a.eps);
  s.weight_decay = static_cast<float>(a.weight_decay);
  s.lr_ratio = static_cast<float>(a.lr_ratio);
  return s;
}

__device__ __forceinline__ float lamb_direction(float m, float v, const LambScalars& s) {
  return (m * s.inv_c1) / (sqrtf(v * s.inv_c2) + s.eps);
}

__global__ void lamb_moments_kernel(const float* __restrict__ grad, float* __restrict__ m, float* __restrict__ v,
                                    std::int64_t n, std::int64_t chunks, LambScalars s) {
  const std::int64_t i0 = thread_index(), step = thread_stride();
  for (std::int64_t c = i0; c < chunks; c += step) {
    const std::int64_t o = c * kChunk;
    float g[kChunk], mm[kChunk], vv[kChunk];
    load_chunk(grad + o, g);
    load_chunk(m + o, mm);
    load_chunk(v + o, vv);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      const float gi = g[e] * s.grad_scale;
      mm[e] = s.beta1 * mm[e] + s.one_minus_beta1 * gi;
      vv[e] = s.beta2 * vv[e] + s.one_minus_beta2 * gi * gi;
    }
    store_chunk(m + o, mm);
    store_chunk(v + o, vv);
  }
  for (std::int64_t i = chunks * kChunk + i0; i < n; i += step) {
    const float gi = grad[i] * s.grad_scale;
    m[i] = s.beta1 * m[i] + s.one_minus_beta1 * gi;
    v[i] = s.beta2 * v[i] + s.one_minus_beta2 * gi * gi;
  }
}

template <class Low>
__global__ void lamb_update_kernel(float* __restrict__ param, const float* __restrict__ m, const float* __restrict__ v,
                                   Low* __restrict__ low, std::int64_t n, std::int64_t chunks, LambScalars s) {
  const std::int64_t i0 = thread_index(), step = thread_stride();
  for (std::int64_t c = i0; c < chunks; c += step) {
    const std::int64_t o = c * kChunk;
    float p[kChunk], mm[kChunk], vv[kChunk];
    load_chunk(param + o, p);
    load_chunk(m + o, mm);
    load_chunk(v + o, vv);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) p[e] -= s.lr_ratio * (lamb_direction(mm[e], vv[e], s) + s.weight_decay * p[e]);
    store_chunk(param + o, p);
    if constexpr (!std::is_void_v<Low>) store_chunk(low + o, p);
  }
  for (std::int64_t i = chunks * kChunk + i0; i < n; i += step) {
    float p = param[i];
    p -= s.lr_ratio * (lamb_direction(m[i], v[i], s) + s.weight_decay * p);
    param[i] = p;
    if constexpr (!std::is_void_v<Low>) low[i] = from_f32<Low>(p);
  }
}

// Per span (blockIdx.y) and block (blockIdx.x of blocks_per_span): K fp32 partial sums at
// partials[(span * blocks_per_span + block) * K + k]. LARS (K = 2): p^2, (g gs)^2; LAMB (K = 3):
// p^2, r^2, r p.
struct SpanDev {
  std::int64_t offset, numel;
};
template <bool kLamb>
__global__ void span_norms_kernel(const float* __restrict__ param, const float* __restrict__ a,
                                  const float* __restrict__ b, const SpanDev* __restrict__ spans, float grad_scale,
                                  LambScalars s, float* __restrict__ partials) {
  constexpr int K = kLamb ? 3 : 2;
  __shared__ float scratch[32];
  const SpanDev sp = spans[blockIdx.y];
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  float acc[K] = {};
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < sp.numel; i += stride) {
    const std::int64_t j = sp.offset + i;
    const float p = param[j];
    acc[0] = fmaf(p, p, acc[0]);
    if constexpr (kLamb) {
      const float r = lamb_direction(a[j], b[j], s);
      acc[1] = fmaf(r, r, acc[1]);
      acc[2] = fmaf(r, p, acc[2]);
    } else {
      const float g = a[j] * grad_scale;
      acc[1] = fmaf(g, g, acc[1]);
    }
  }
  float* out = partials + (static_cast<std::int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * K;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const float total = block_sum(acc[k], scratch);
    if (threadIdx.x == 0) out[k] = total;
  }
}

// Launches span_norms_kernel and adds each span's partials on the host (one wait).
template <bool kLamb>
std::vector<double> span_norms(Context& ctx, const Tensor& param, const Tensor& a, const Tensor* b, double grad_scale,
                               const LambScalars& s, const std::vector<Span>& spans) {
  constexpr int K = kLamb ? 3 : 2;
  for (const Tensor* t : std::initializer_list<const Tensor*>{&param, &a, b})
    LMSCALE_CHECK(!t || t->dtype() == DType::f32, "{}: fp32 tensors only on CUDA", kLamb ? "lamb_norms" : "lars_norms");
  LMSCALE_CHECK(spans.size() <= 65535, "trust-ratio norms: {} spans in one call (at most 65535)", spans.size());
  Resources& r = resources(ctx);
  std::int64_t largest = 1;
  for (const auto& sp : spans) largest = std::max(largest, sp.numel);
  const int per_span = static_cast<int>(
      std::min<std::int64_t>(kMaxBlocksPerSpan, std::max<std::int64_t>(1, (largest + kThreads * 16 - 1) / (kThreads * 16))));
  const std::int64_t S = static_cast<std::int64_t>(spans.size());
  // Spans travel in a small device buffer (a pageable copy: the host vector may go out of scope).
  Tensor span_host = Tensor::empty({S * 2}, DType::i64, *ctx.host, "trust_norms");
  for (std::int64_t i = 0; i < S; ++i) {
    span_host.data_as<std::int64_t>()[2 * i] = spans[static_cast<std::size_t>(i)].offset;
    span_host.data_as<std::int64_t>()[2 * i + 1] = spans[static_cast<std::size_t>(i)].numel;
  }
  Tensor span_dev = Tensor::empty({S * 2}, DType::i64, *ctx.allocator, "trust_norms");
  copy(ctx, span_host, span_dev);
  Tensor partials = Tensor::empty({S * per_span * K}, DType::f32, *ctx.allocator, "trust_norms");
  const dim3 grid(static_cast<unsigned>(per_span), static_cast<unsigned>(S));
  span_norms_kernel<kLamb><<<grid, kThreads, 0, r.stream>>>(
      param.data_as<const float>(), a.data_as<const float>(), b ? b->data_as<const float>() : nullptr,
      span_dev.data_as<const SpanDev>(), static_cast<float>(grad_scale), s, partials.data_as<float>());
  LMSCALE_CUDA_CHECK_LAUNCH();
  Tensor host = Tensor::empty({S * per_span * K}, DType::f32, *ctx.host, "trust_norms");
  copy(ctx, partials, host);   // waits for the stream
  std::vector<double> out(static_cast<std::size_t>(S * K), 0.0);
  const float* h = host.data_as<const float>();
  for (std::int64_t sp = 0; sp < S; ++sp)
    for (int blk = 0; blk < per_span; ++blk)
      for (int k = 0; k < K; ++k) out[static_cast<std::size_t>(sp * K + k)] += h[(sp * per_span + blk) * K + k];
  return out;
}

bool aligned(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t && !is_aligned16(t->data())) return false;
  return true;
}

void check_f32(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) LMSCALE_CHECK(t->dtype() == DType::f32, "{}: fp32 master buffers only on CUDA", op);
}

}  // namespace

void momentum_update(Context& ctx, Tensor& param, const Tensor& grad, Tensor& buf, const MomentumStep& a,
                     Tensor* param_lowp) {
  check_f32("momentum_update", {&param, &grad, &buf});
  const std::int64_t n = param.numel();
  if (n == 0) return;
  Resources& r = resources(ctx);
  const MomentumScalars s{static_cast<float>(a.momentum), static_cast<float>(a.weight_decay),
                          static_cast<float>(a.grad_scale), static_cast<float>(a.coeff), static_cast<float>(a.step),
                          a.nesterov};
  const std::int64_t chunks = aligned({&param, &grad, &buf, param_lowp}) ? n / kChunk : 0;
  const unsigned grid = grid_for(std::max<std::int64_t>(chunks, n - chunks * kChunk), kThreads, r.num_sms, 4);
  float* p = param.data_as<float>();
  const float* g = grad.data_as<const float>();
  float* b = buf.data_as<float>();
  if (!param_lowp) {
    momentum_kernel<void><<<grid, kThreads, 0, r.stream>>>(p, g, b, nullptr, n, chunks, s);
  } else if (param_lowp->dtype() == DType::bf16) {
    momentum_kernel<__nv_bfloat16><<<grid, kThreads, 0, r.stream>>>(p, g, b, param_lowp->data_as<__nv_bfloat16>(), n,
                                                                    chunks, s);
  } else if (param_lowp->dtype() == DType::f16) {
    momentum_kernel<__half><<<grid, kThreads, 0, r.stream>>>(p, g, b, param_lowp->data_as<__half>(), n, chunks, s);
  } else {
    throw Error(fmt::format("momentum_update: param_lowp is {}, expected bf16 or fp16", dtype_name(param_lowp->dtype())));
  }
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void lamb_moments(Context& ctx, const Tensor& grad, Tensor& m, Tensor& v, const LambStep& a) {
  check_f32("lamb_moments", {&grad, &m, &v});
  const std::int64_t n = grad.numel();
  if (n == 0) return;
  Resources& r = resources(ctx);
  const std::int64_t chunks = aligned({&grad, &m, &v}) ? n / kChunk : 0;
  const unsigned grid = grid_for(std::max<std::int64_t>(chunks, n - chunks * kChunk), kThreads, r.num_sms, 4);
  lamb_moments_kernel<<<grid, kThreads, 0, r.stream>>>(grad.data_as<const float>(), m.data_as<float>(),
                                                       v.data_as<float>(), n, chunks, lamb_scalars(a));
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void lamb_update(Context& ctx, Tensor& param, const Tensor& m, const Tensor& v, const LambStep& a, Tensor* param_lowp) {
  check_f32("lamb_update", {&param, &m, &v});
  const std::int64_t n = param.numel();
  if (n == 0) return;
  Resources& r = resources(ctx);
  const LambScalars s = lamb_scalars(a);
  const std::int64_t chunks = aligned({&param, &m, &v, param_lowp}) ? n / kChunk : 0;
  const unsigned grid = grid_for(std::max<std::int64_t>(chunks, n - chunks * kChunk), kThreads, r.num_sms, 4);
  float* p = param.data_as<float>();
  const float* mp = m.data_as<const float>();
  const float* vp = v.data_as<const float>();
  if (!param_lowp) {
    lamb_update_kernel<void><<<grid, kThreads, 0, r.stream>>>(p, mp, vp, nullptr, n, chunks, s);
  } else if (param_lowp->dtype() == DType::bf16) {
    lamb_update_kernel<__nv_bfloat16><<<grid, kThreads, 0, r.stream>>>(p, mp, vp,
                                                                       param_lowp->data_as<__nv_bfloat16>(), n, chunks, s);
  } else if (param_lowp->dtype() == DType::f16) {
    lamb_update_kernel<__half><<<grid, kThreads, 0, r.stream>>>(p, mp, vp, param_lowp->data_as<__half>(), n, chunks, s);
  } else {
    throw Error(fmt::format("lamb_update: param_lowp is {}, expected bf16 or fp16", dtype_name(param_lowp->dtype())));
  }
  LMSCALE_CUDA_CHECK_LAUNCH();
}

std::vector<double> lars_norms(Context& ctx, const Tensor& param, const Tensor& grad, double grad_scale,
                               const std::vector<Span>& spans) {
  return span_norms<false>(ctx, param, grad, nullptr, grad_scale, LambScalars{}, spans);
}

std::vector<double> lamb_norms(Context& ctx, const Tensor& param, const Tensor& m, const Tensor& v, const LambStep& s,
                               const std::vector<Span>& spans) {
  return span_norms<true>(ctx, param, m, &v, 1.0, lamb_scalars(s), spans);
}

}  // namespace lmscale::ops::cuda
