#include "host_reduce.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "lmscale/core/error.h"

namespace lmscale::comm::detail {

namespace {

// Accumulation type of each element type and the conversions to and from it.
template <class T>
struct Acc {
  using type = T;
  static T load(T v) { return v; }
  static T store(T a) { return a; }
};
template <>
struct Acc<bf16_t> {
  using type = float;
  static float load(bf16_t v) { return bf16_to_float(v); }
  static bf16_t store(float a) { return float_to_bf16(a); }
};
template <>
struct Acc<f16_t> {
  using type = float;
  static float load(f16_t v) { return f16_to_float(v); }
  static f16_t store(float a) { return float_to_f16(a); }
};

template <class A>
inline A add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <ReduceOp OP, class A>
inline A combine(A a, A b) {
  if constexpr (OP == ReduceOp::max) {
    return b > a ? b : a;
  } else {
    return add(a, b);
  }
}

template <ReduceOp OP, class A>
inline A finish_value(A a, int group_size) {
  if constexpr (OP == ReduceOp::avg) {
    return a / static_cast<A>(group_size);
  } else {
    (void)group_size;
    return a;
  }
}

template <class T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) for the element type of t.
template <class F>
void on_type(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(Tag<float>{}); return;
    case DType::f64: f(Tag<double>{}); return;
    case DType::bf16: f(Tag<bf16_t>{}); return;
    case DType::f16: f(Tag<f16_t>{}); return;
    case DType::i32: f(Tag<std::int32_t>{}); return;
    case DType::i64: f(Tag<std::int64_t>{}); return;
    default: throw Error(fmt::format("host reduction: unsupported dtype {}", dtype_name(t)));
  }
}

template <class F>
void on_op(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::sum: f(std::integral_constant<ReduceOp, ReduceOp::sum>{}); return;
    case ReduceOp::avg: f(std::integral_constant<ReduceOp, ReduceOp::avg>{}); return;
    case ReduceOp::max: f(std::integral_constant<ReduceOp, ReduceOp::max>{}); return;
  }
}

// Blocked so that the accumulator stays in L1 while the m inputs stream through.
template <class T, ReduceOp OP>
void reduce_into_t(int group_size, T* out, T* out2, const T* const* in, int m, std::size_t n) {
  using A = typename Acc<T>::type;
  constexpr std::size_t kBlock = 2048;
  A acc[kBlock];
  for (std::size_t i0 = 0; i0 < n; i0 += kBlock) {
    const std::size_t b = std::min(kBlock, n - i0);
    const T* in0 = in[0] + i0;
    for (std::size_t j = 0; j < b; ++j) acc[j] = Acc<T>::load(in0[j]);
    for (int k = 1; k < m; ++k) {
      const T* ik = in[k] + i0;
      for (std::size_t j = 0; j < b; ++j) acc[j] = combine<OP>(acc[j], Acc<T>::load(ik[j]));
    }
    T* o = out + i0;
    for (std::size_t j = 0; j < b; ++j) o[j] = Acc<T>::store(finish_value<OP>(acc[j], group_size));
    if (out2) std::copy(o, o + b, out2 + i0);
  }
}

}  // namespace

DType accumulation_dtype(DType t) { return (t == DType::bf16 || t == DType::f16) ? DType::f32 : t; }

void reduce_into(DType t, ReduceOp op, int group_size, void* out, void* out2, const void* const* in, int m,
                 std::size_t n) {
  if (n == 0) return;
  LMSCALE_CHECK(m >= 1, "reduce_into needs at least one input");
  on_type(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    on_op(op, [&](auto opc) {
      reduce_into_t<T, decltype(opc)::value>(group_size, static_cast<T*>(out), static_cast<T*>(out2),
                                             reinterpret_cast<const T* const*>(in), m, n);
    });
  });
}

void accumulate(DType acc_t, void* acc, DType src_t, const void* src, ReduceOp op, std::size_t n) {
  LMSCALE_CHECK(acc_t == accumulation_dtype(src_t), "accumulate {} into {}", dtype_name(src_t), dtype_name(acc_t));
  on_type(src_t, [&](auto tag) {
    using S = typename decltype(tag)::type;
    using A = typename Acc<S>::type;
    on_op(op, [&](auto opc) {
      A* a = static_cast<A*>(acc);
      const S* s = static_cast<const S*>(src);
      for (std::size_t i = 0; i < n; ++i) a[i] = combine<decltype(opc)::value>(a[i], Acc<S>::load(s[i]));
    });
  });
}

void finish(DType acc_t, const void* acc, DType dst_t, void* dst, ReduceOp op, int group_size, std::size_t n) {
  LMSCALE_CHECK(acc_t == accumulation_dtype(dst_t), "finish {} into {}", dtype_name(acc_t), dtype_name(dst_t));
  on_type(dst_t, [&](auto tag) {
    using D = typename decltype(tag)::type;
    using A = typename Acc<D>::type;
    on_op(op, [&](auto opc) {
      const A* a = static_cast<const A*>(acc);
      D* d = static_cast<D*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = Acc<D>::store(finish_value<decltype(opc)::value>(a[i], group_size));
    });
  });
}

void widen(DType src_t, const void* src, DType dst_t, void* dst, std::size_t n) {
  LMSCALE_CHECK(dst_t == accumulation_dtype(src_t), "widen {} into {}", dtype_name(src_t), dtype_name(dst_t));
  on_type(src_t, [&](auto tag) {
    using S = typename decltype(tag)::type;
    using A = typename Acc<S>::type;
    const S* s = static_cast<const S*>(src);
    A* d = static_cast<A*>(dst);
    for (std::size_t i = 0; i < n; ++i) d[i] = Acc<S>::load(s[i]);
  });
}

}  // namespace lmscale::comm::detail
