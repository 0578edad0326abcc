// The FP8 ops on the CPU (lmscale/ops/fp8.h): the references of the CUDA kernels. amax, the cast,
// the transpose and the scale update are bitwise what the kernels compute (the same scalar rules,
// ops/fp8_scale_rule.h, and core/fp8.h's conversion); the GEMM decodes its operands and
// multiplies in fp64.
#include <algorithm>
#include <array>
#include <cstring>

#include "../fp8_scale_rule.h"
#include "cpu_ops.h"
#include "dtype_dispatch.h"

namespace lmscale::ops::cpu {
namespace {

// Element i of a floating tensor as the fp32 the CUDA kernels read (fp64 rounded once).
template <class T>
float element_f32(const T* p, std::int64_t i) {
  return load_f32(p[i]);
}

std::uint32_t amax_bits(const Tensor& x) {
  std::uint32_t m = 0;
  dispatch_floating("ops::amax", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data_as<T>();
    for (std::int64_t i = 0, n = x.numel(); i < n; ++i) m = std::max(m, fp8_rule::abs_bits(element_f32(p, i)));
  });
  return m;
}

void store_bits(Tensor& out, std::uint32_t bits) { std::memcpy(out.data(), &bits, 4); }

// The 256 values of a format, decoded once.
std::array<double, 256> decode_table(DType t) {
  std::array<double, 256> v{};
  const Fp8Format f = fp8_format(t);
  for (int c = 0; c < 256; ++c) v[static_cast<std::size_t>(c)] = fp8_to_float(static_cast<std::uint8_t>(c), f);
  return v;
}

}  // namespace

void amax(Context&, const Tensor& x, Tensor& out) { store_bits(out, amax_bits(x)); }

void cast_fp8(Context& ctx, const Tensor& x, const Tensor& scale, Tensor& out, Tensor* amax_out,
              const Fp8HistoryUpdate* update) {
  if (update) {   // the scale from the history first; the amax into the slot after
    Tensor scale_out = scale;
    Tensor inv = update->inv_scale;
    fp8_update_scale(ctx, update->amax_history, update->format, update->margin, scale_out, inv);
  }
  const Fp8Format f = fp8_format(out.dtype());
  const float s = *scale.data_as<const float>();
  auto* o = out.data_as<std::uint8_t>();
  dispatch_floating("ops::cast_fp8", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data_as<T>();
    for (std::int64_t i = 0, n = x.numel(); i < n; ++i)
      o[i] = float_to_fp8(element_f32(p, i) * s, f, Fp8Overflow::satfinite);
  });
  if (amax_out) store_bits(*amax_out, amax_bits(x));
  if (update && update->record_slot >= 0) {
    Tensor slot = update->amax_history.flat_range(update->record_slot, 1);
    store_bits(slot, amax_bits(x));
  }
}

void fp8_amax_update_scale(Context& ctx, const Tensor& x, Tensor& amax_history, std::int64_t slot, Fp8Format format,
                           int margin, Tensor& scale, Tensor& inv_scale) {
  Tensor entry = amax_history.flat_range(slot, 1);
  store_bits(entry, amax_bits(x));
  fp8_update_scale(ctx, amax_history, format, margin, scale, inv_scale);
}

void transpose_fp8(Context&, const Tensor& x, Tensor& out) {
  const std::int64_t R = x.dim(0), C = x.dim(1);
  const auto* in = x.data_as<const std::uint8_t>();
  auto* o = out.data_as<std::uint8_t>();
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c) o[c * R + r] = in[r * C + c];
}

void cast_transpose_fp8(Context& ctx, const Tensor& x, const Tensor& scale, Tensor* out, Tensor& out_t,
                        const Fp8HistoryUpdate* update) {
  if (update) {   // as cast_fp8: the scale from the history first, the amax into the slot after
    Tensor scale_out = scale;
    Tensor inv = update->inv_scale;
    fp8_update_scale(ctx, update->amax_history, update->format, update->margin, scale_out, inv);
  }
  const Fp8Format f = fp8_format(out_t.dtype());
  const float s = *scale.data_as<const float>();
  const std::int64_t M = x.dim(0), K = x.dim(1);
  auto* o = out ? out->data_as<std::uint8_t>() : nullptr;
  auto* ot = out_t.data_as<std::uint8_t>();
  dispatch_floating("ops::cast_transpose_fp8", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data_as<T>();
    for (std::int64_t r = 0; r < M; ++r)
      for (std::int64_t c = 0; c < K; ++c) {
        const std::uint8_t code = float_to_fp8(element_f32(p, r * K + c) * s, f, Fp8Overflow::satfinite);
        if (o) o[r * K + c] = code;
        ot[c * M + r] = code;
      }
  });
  if (update && update->record_slot >= 0) {
    Tensor slot = update->amax_history.flat_range(update->record_slot, 1);
    store_bits(slot, amax_bits(x));
  }
}

void gather_scalars(Context&, std::initializer_list<const Tensor*> sources, Tensor& out, std::int64_t stride) {
  float* o = out.data_as<float>();
  std::int64_t i = 0;
  for (const Tensor* t : sources) o[stride * i++] = *t->data_as<const float>();
}

void fp8_update_scale(Context&, const Tensor& amax_history, Fp8Format format, int margin, Tensor& scale,
                      Tensor& inv_scale) {
  const float* h = amax_history.data_as<const float>();
  float a = 0.f;
  for (std::int64_t i = 0, n = amax_history.numel(); i < n; ++i)
    if (h[i] > a) a = h[i];   // NaN compares false: skipped
  if (!fp8_rule::usable_amax(a)) return;
  const int k = fp8_rule::scale_exponent(a, fp8_max(format), margin);
  *scale.data_as<float>() = fp8_rule::exp2i(k);
  *inv_scale.data_as<float>() = fp8_rule::exp2i(-k);
}

// The exact product of the decoded operands, summed in fp64. It takes no Fp8Accumulation: Hopper's
// fast accumulation (partial sums truncated to the tensor cores' ~14 bits, never promoted) is
// undocumented hardware rounding that this reference does not model, so ops::linear_fp8 drops the
// setting on the CPU and a CPU fp8 run is the same for every precision.fp8_fast_accum
// (docs/precision.md, "Error bounds").
void linear_fp8(Context&, const Tensor& a, const Tensor& a_inv, const Tensor& b, const Tensor& b_inv, Tensor& y,
                bool accumulate) {
  const std::int64_t K = a.dim(-1), M = K == 0 ? 0 : a.numel() / K, N = b.dim(0);
  const std::array<double, 256> da = decode_table(a.dtype()), db = decode_table(b.dtype());
  const double factor = static_cast<double>(*a_inv.data_as<const float>()) * *b_inv.data_as<const float>();
  const auto* ap = a.data_as<const std::uint8_t>();
  const auto* bp = b.data_as<const std::uint8_t>();
  std::vector<double> row(static_cast<std::size_t>(K));
  dispatch_real("ops::linear_fp8", y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* yp = y.data_as<T>();
    for (std::int64_t i = 0; i < M; ++i) {
      for (std::int64_t k = 0; k < K; ++k) row[static_cast<std::size_t>(k)] = da[ap[i * K + k]];
      for (std::int64_t j = 0; j < N; ++j) {
        double acc = 0;
        const std::uint8_t* bj = bp + j * K;
        for (std::int64_t k = 0; k < K; ++k) acc += row[static_cast<std::size_t>(k)] * db[bj[k]];
        const double v = acc * factor;
        yp[i * N + j] = static_cast<T>(accumulate ? static_cast<double>(yp[i * N + j]) + v : v);
      }
    }
  });
}

}  // namespace lmscale::ops::cpu
