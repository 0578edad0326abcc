// ops::adamw_host: AdamW over host fp32 ranges for optimizer offload, in the arithmetic of the
// device's own AdamW (include/lmscale/ops/host_adamw.h gives the two orders and why).
// Built with -ffp-contract=off (src/CMakeLists.txt): every fma below is written out, and no
// other product is fused, so the compiler cannot change the rounding behind our back.
//
// Vectorised by hand with AVX2 + FMA behind a run-time check (the build targets baseline x86-64):
// 8 elements per iteration; the scalar loop takes the tail and CPUs without AVX2. Threads take
// blocks of 64 Ki elements in turn (parallel_parts). The ops layer sits below comm/ (where
// lmscale's thread pool lives), so threads are started per call: tens of microseconds against
// the milliseconds a bucket of millions of parameters takes (28 bytes moved per parameter).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "../checks.h"
#include "dtype_dispatch.h"
#include "lmscale/ops/host_adamw.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LMSCALE_HOST_ADAMW_AVX2 1
#endif

namespace lmscale::ops {
namespace {

// The per-step scalars, rounded to float once from double (as scalars() in adamw.cu and
// StepScalars in cpu/adamw.cpp do).
struct Scalars {
  float decay;        // 1 - lr*wd   (cuda_kernel)
  float lr_wd;        // lr*wd       (cpu_reference)
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float step_size;    // lr * sqrt(1 - b2^t) / (1 - b1^t)
  float eps, grad_scale;
};

Scalars scalars_of(const AdamWStep& a) {
  const double t = static_cast<double>(a.step);
  Scalars s;
  s.decay = static_cast<float>(1.0 - a.lr * a.weight_decay);
  s.lr_wd = static_cast<float>(a.lr * a.weight_decay);
  s.beta1 = static_cast<float>(a.beta1);
  s.beta2 = static_cast<float>(a.beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - a.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - a.beta2);
  s.step_size = static_cast<float>(a.lr * std::sqrt(1.0 - std::pow(a.beta2, t)) / (1.0 - std::pow(a.beta1, t)));
  s.eps = static_cast<float>(a.eps);
  s.grad_scale = static_cast<float>(a.grad_scale);
  return s;
}

// One element. L: bf16_t, f16_t or std::nullptr_t (no working copy).
template <AdamWArithmetic A, class L>
inline void update_one(float& p, float grad, float& m, float& v, L* low, const Scalars& s) {
  if constexpr (A == AdamWArithmetic::cuda_kernel) {
    const float g = grad * s.grad_scale;
    m = std::fma(s.one_minus_beta1, g, s.beta1 * m);
    v = std::fma(s.one_minus_beta2 * g, g, s.beta2 * v);
    const float d = (s.step_size * m) / (std::sqrt(v) + s.eps);
    p = std::fma(s.decay, p, -d);
  } else {
    float q = p;
    q -= s.lr_wd * q;
    const float g = grad * s.grad_scale;
    m = s.beta1 * m + s.one_minus_beta1 * g;
    v = s.beta2 * v + s.one_minus_beta2 * g * g;
    q -= s.step_size * m / (std::sqrt(v) + s.eps);
    p = q;
  }
  if constexpr (!std::is_same_v<L, std::nullptr_t>) *low = cpu::store_from_f32<L>(p);
}

template <AdamWArithmetic A, class L>
void update_scalar(std::int64_t begin, std::int64_t end, float* p, const float* g, float* m, float* v, L* low,
                   const Scalars& s) {
  for (std::int64_t i = begin; i < end; ++i) {
    L* li = nullptr;
    if constexpr (!std::is_same_v<L, std::nullptr_t>) li = low + i;
    update_one<A, L>(p[i], g[i], m[i], v[i], li, s);
  }
}

#ifdef LMSCALE_HOST_ADAMW_AVX2
// 8 fp32 lanes -> 8 bf16 with float_to_bf16's rounding (core/dtype.h): round to nearest even,
// NaN kept quiet by setting bit 6 of the kept half.
__attribute__((target("avx2,fma"))) inline void store_bf16x8(bf16_t* out, __m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i odd = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
  const __m256i nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
  // packus per 128-bit lane: [r0..r3 r0..r3 | r4..r7 r4..r7]; gather the two low quadwords.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
}

template <AdamWArithmetic A, class L>
__attribute__((target("avx2,fma"))) void update_avx2(std::int64_t begin, std::int64_t end, float* p, const float* g,
                                                     float* m, float* v, L* low, const Scalars& s) {
  const __m256 decay = _mm256_set1_ps(s.decay), lr_wd = _mm256_set1_ps(s.lr_wd);
  const __m256 b1 = _mm256_set1_ps(s.beta1), b2 = _mm256_set1_ps(s.beta2);
  const __m256 c1 = _mm256_set1_ps(s.one_minus_beta1), c2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 step = _mm256_set1_ps(s.step_size), eps = _mm256_set1_ps(s.eps), gs = _mm256_set1_ps(s.grad_scale);
  std::int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 pv = _mm256_loadu_ps(p + i), mv = _mm256_loadu_ps(m + i), vv = _mm256_loadu_ps(v + i);
    const __m256 gv = _mm256_mul_ps(_mm256_loadu_ps(g + i), gs);
    if constexpr (A == AdamWArithmetic::cuda_kernel) {
      mv = _mm256_fmadd_ps(c1, gv, _mm256_mul_ps(b1, mv));
      vv = _mm256_fmadd_ps(_mm256_mul_ps(c2, gv), gv, _mm256_mul_ps(b2, vv));
      const __m256 d = _mm256_div_ps(_mm256_mul_ps(step, mv), _mm256_add_ps(_mm256_sqrt_ps(vv), eps));
      pv = _mm256_fmsub_ps(decay, pv, d);   // fma(decay, p, -d): one rounding
    } else {
      pv = _mm256_sub_ps(pv, _mm256_mul_ps(lr_wd, pv));
      mv = _mm256_add_ps(_mm256_mul_ps(b1, mv), _mm256_mul_ps(c1, gv));
      vv = _mm256_add_ps(_mm256_mul_ps(b2, vv), _mm256_mul_ps(_mm256_mul_ps(c2, gv), gv));
      pv = _mm256_sub_ps(pv, _mm256_div_ps(_mm256_mul_ps(step, mv), _mm256_add_ps(_mm256_sqrt_ps(vv), eps)));
    }
    _mm256_storeu_ps(p + i, pv);
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
    if constexpr (std::is_same_v<L, bf16_t>) {
      store_bf16x8(low + i, pv);
    } else if constexpr (!std::is_same_v<L, std::nullptr_t>) {
      for (int e = 0; e < 8; ++e) low[i + e] = cpu::store_from_f32<L>(p[i + e]);
    }
  }
  update_scalar<A, L>(i, end, p, g, m, v, low, s);
}

bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif

template <AdamWArithmetic A, class L>
void update_range(std::int64_t begin, std::int64_t end, float* p, const float* g, float* m, float* v, L* low,
                  const Scalars& s) {
#ifdef LMSCALE_HOST_ADAMW_AVX2
  if (cpu_has_avx2_fma()) return update_avx2<A, L>(begin, end, p, g, m, v, low, s);
#endif
  update_scalar<A, L>(begin, end, p, g, m, v, low, s);
}

// Runs fn over [0, n) in blocks of kBlock elements (whole 64-byte lines) that `threads` threads
// take in turn from a shared counter; the caller is one of them. Blocks taken on demand, not
// equal static parts: a thread the OS deschedules (the host's cores are shared with the ranks'
// GPU-driving and NCCL threads) delays only the blocks it holds, not a whole part. The update is
// elementwise, so the split does not change a bit of the result.
template <class Fn>
void parallel_parts(std::int64_t n, int threads, const Fn& fn) {
  constexpr std::int64_t kBlock = std::int64_t{1} << 16;   // 64 Ki elements, ~2 MB of traffic
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  const int workers_wanted = static_cast<int>(std::clamp<std::int64_t>(threads, 1, std::max<std::int64_t>(blocks, 1)));
  std::atomic<std::int64_t> next{0};
  auto work = [&] {
    for (std::int64_t b = next.fetch_add(1); b < blocks; b = next.fetch_add(1))
      fn(b * kBlock, std::min(n, (b + 1) * kBlock));
  };
  std::vector<std::thread> workers;
  workers.reserve(workers_wanted - 1);
  for (int k = 1; k < workers_wanted; ++k) workers.emplace_back(work);
  work();
  for (std::thread& t : workers) t.join();
}

template <AdamWArithmetic A>
void run(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const Scalars& s, Tensor* low, int threads) {
  float* p = param.data_as<float>();
  const float* g = grad.data_as<const float>();
  float* mp = m.data_as<float>();
  float* vp = v.data_as<float>();
  const std::int64_t n = param.numel();
  if (!low) {
    return parallel_parts(n, threads, [&](std::int64_t b, std::int64_t e) {
      update_range<A, std::nullptr_t>(b, e, p, g, mp, vp, nullptr, s);
    });
  }
  if (low->dtype() == DType::bf16) {
    bf16_t* lp = low->data_as<bf16_t>();
    return parallel_parts(n, threads, [&](std::int64_t b, std::int64_t e) {
      update_range<A, bf16_t>(b, e, p, g, mp, vp, lp, s);
    });
  }
  f16_t* lp = low->data_as<f16_t>();
  parallel_parts(n, threads,
                 [&](std::int64_t b, std::int64_t e) { update_range<A, f16_t>(b, e, p, g, mp, vp, lp, s); });
}

}  // namespace

bool adamw_host_vectorised() {
#ifdef LMSCALE_HOST_ADAMW_AVX2
  return cpu_has_avx2_fma();
#else
  return false;
#endif
}

void adamw_host(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& a, Tensor* param_lowp,
                AdamWArithmetic arithmetic, int threads) {
  constexpr const char* op = "ops::adamw_host";
  for (const auto& [name, t] : {detail::NamedTensor{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}}) {
    LMSCALE_CHECK(t->device() == Device::cpu && t->dtype() == DType::f32, "{}: {} must be an fp32 host tensor", op,
                  name);
    detail::check_numel(op, name, *t, param.numel());
  }
  if (param_lowp) {
    LMSCALE_CHECK(param_lowp->device() == Device::cpu &&
                      (param_lowp->dtype() == DType::bf16 || param_lowp->dtype() == DType::f16),
                  "{}: param_lowp must be a bf16 or fp16 host tensor", op);
    detail::check_numel(op, "param_lowp", *param_lowp, param.numel());
  }
  LMSCALE_CHECK(a.step >= 1 && threads >= 1, "{}: step t is 1-based (got {}), threads >= 1 (got {})", op, a.step,
                threads);
  const Scalars s = scalars_of(a);
  if (arithmetic == AdamWArithmetic::cuda_kernel) run<AdamWArithmetic::cuda_kernel>(param, grad, m, v, s, param_lowp, threads);
  else run<AdamWArithmetic::cpu_reference>(param, grad, m, v, s, param_lowp, threads);
}

}  // namespace lmscale::ops
