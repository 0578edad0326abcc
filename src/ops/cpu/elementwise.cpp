// Elementwise ops and reductions on the CPU. These take all four floating dtypes: bf16/fp16 load
// into float, compute, and store back with one round-to-nearest-even; fp32/fp64 loops are plain
// loops over contiguous memory that the compiler vectorises.
#include <cstring>

#include "cpu_ops.h"
#include "dtype_dispatch.h"
#include "reduce.h"

namespace lmscale::ops::cpu {
namespace {

template <class T>
void fill_as(Tensor& x, T value) {
  T* p = x.data_as<T>();
  const std::int64_t n = x.numel();
  for (std::int64_t i = 0; i < n; ++i) p[i] = value;
}

// Elements whose exponent field is all ones (inf or nan), counted by bit pattern.
template <class Bits>
bool any_nonfinite(const void* data, std::int64_t n, Bits exponent_mask) {
  const Bits* p = static_cast<const Bits*>(data);
  Bits hits = 0;
  for (std::int64_t i = 0; i < n; ++i) hits |= static_cast<Bits>((p[i] & exponent_mask) == exponent_mask);
  return hits != 0;
}

}  // namespace

void fill(Context&, Tensor& x, double value) {
  switch (x.dtype()) {
    case DType::i32: return fill_as(x, static_cast<std::int32_t>(value));
    case DType::i64: return fill_as(x, static_cast<std::int64_t>(value));
    case DType::u16: return fill_as(x, static_cast<std::uint16_t>(value));
    case DType::u32: return fill_as(x, static_cast<std::uint32_t>(value));
    case DType::u8: return fill_as(x, static_cast<std::uint8_t>(value));
    default:
      dispatch_floating("ops::fill", x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        fill_as(x, store_from_f64<T>(value));
      });
  }
}

void add(Context&, const Tensor& a, const Tensor& b, Tensor& out) {
  dispatch_floating("ops::add", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* ap = a.data_as<T>();
    const T* bp = b.data_as<T>();
    T* op = out.data_as<T>();
    const std::int64_t n = a.numel();
    for (std::int64_t i = 0; i < n; ++i) op[i] = store<T>(load(ap[i]) + load(bp[i]));
  });
}

void scale(Context&, Tensor& x, double s) {
  dispatch_floating("ops::scale", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const compute_t<T> f = static_cast<compute_t<T>>(s);
    T* p = x.data_as<T>();
    const std::int64_t n = x.numel();
    for (std::int64_t i = 0; i < n; ++i) p[i] = store<T>(load(p[i]) * f);
  });
}

void cast(Context& ctx, const Tensor& src, Tensor& dst) {
  if (src.dtype() == dst.dtype()) return copy(ctx, src, dst);
  const std::int64_t n = src.numel();
  dispatch_floating("ops::cast", src.dtype(), [&](auto src_tag) {
    using S = decltype(src_tag);
    dispatch_floating("ops::cast", dst.dtype(), [&](auto dst_tag) {
      using D = decltype(dst_tag);
      const S* s = src.data_as<S>();
      D* d = dst.data_as<D>();
      if constexpr (std::is_same_v<D, double>) {
        for (std::int64_t i = 0; i < n; ++i) d[i] = load_f64(s[i]);   // exact
      } else if constexpr (std::is_same_v<S, double>) {
        for (std::int64_t i = 0; i < n; ++i) d[i] = store_from_f64<D>(s[i]);   // one rounding
      } else {
        for (std::int64_t i = 0; i < n; ++i) d[i] = store_from_f32<D>(load_f32(s[i]));   // exact load, one rounding
      }
    });
  });
}

void copy(Context&, const Tensor& src, Tensor& dst) {
  if (src.nbytes() == 0 || src.data() == dst.data()) return;
  std::memmove(dst.data(), src.data(), src.nbytes());
}

void sum_squares(Context&, const Tensor& x, Tensor& out) {
  const double total = dispatch_floating("ops::sum_squares", x.dtype(), [&](auto tag) -> double {
    using T = decltype(tag);
    const T* p = x.data_as<T>();
    const std::int64_t n = x.numel();
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      return sum_sq_f64(p, n);
    } else {
      double s = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double v = load_f64(p[i]);
        s += v * v;
      }
      return s;
    }
  });
  if (out.dtype() == DType::f64) {
    out.data_as<double>()[0] = total;
  } else {
    out.data_as<float>()[0] = static_cast<float>(total);
  }
}

void check_finite(Context&, const Tensor& x, Tensor& flag) {
  bool bad = false;
  switch (x.dtype()) {
    case DType::f32: bad = any_nonfinite<std::uint32_t>(x.data(), x.numel(), 0x7f800000u); break;
    case DType::f64: bad = any_nonfinite<std::uint64_t>(x.data(), x.numel(), 0x7ff0000000000000ull); break;
    case DType::bf16: bad = any_nonfinite<std::uint16_t>(x.data(), x.numel(), 0x7f80u); break;
    case DType::f16: bad = any_nonfinite<std::uint16_t>(x.data(), x.numel(), 0x7c00u); break;
    default: throw Error(fmt::format("ops::check_finite: expected a floating dtype, got {}", dtype_name(x.dtype())));
  }
  if (bad) flag.data_as<std::int32_t>()[0] = 1;
}

}  // namespace lmscale::ops::cpu
