// The FP8 casts fused into SwiGLU and its backward on CUDA (ops::swiglu_cast_transpose_fp8,
// ops::swiglu_backward_cast_transpose_fp8; docs/precision.md, "Casts fused into the producers"):
// the 8-wide cast-transpose kernel (cast_transpose.cuh) over sources that compute SwiGLU's values
// from a and b (and dh) and round them to the compute dtype, as the plain kernels store them
// (swiglu.cu, the same arithmetic from swiglu_math.cuh), so the codes and the amax are bitwise
// those of the plain producer followed by ops::cast_transpose_fp8. The bytes saved per output
// element: the compute-dtype write and its read back by the cast.
#include "cast_transpose.cuh"
#include "cuda_ops.h"
#include "resources.h"
#include "swiglu_math.cuh"

namespace lmscale::ops::cuda {
namespace {

// h[r, c] = silu(a) * b, a and b [rows, cols] blocks of rows `ld` apart (the model's a|b [N, 2F]).
template <class T>
struct SwigluSource {
  static constexpr int kOut = 1;
  static constexpr int kTileRows = 64;   // cast_transpose.cuh
  static constexpr bool kLoadsFirst = true;
  const T *a, *b;
  std::int64_t ld;
  __device__ __forceinline__ void load(std::int64_t r, std::int64_t c, float (&v)[1][kChunk]) const {
    float x[kChunk], y[kChunk];
    load_chunk(a + r * ld + c, x);
    load_chunk(b + r * ld + c, y);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) v[0][e] = to_f32(from_f32<T>(swiglu_value(x[e], y[e])));
  }
};

// da (output tile 0) and db (tile 1) at [r, c] from a, b (rows `ld` apart) and dh [rows, cols].
template <class T>
struct SwigluGradSource {
  static constexpr int kOut = 2;
  static constexpr int kTileRows = 64;
  static constexpr bool kLoadsFirst = false;
  const T *a, *b, *dh;
  std::int64_t ld, cols;
  __device__ __forceinline__ void load(std::int64_t r, std::int64_t c, float (&v)[2][kChunk]) const {
    float x[kChunk], y[kChunk], g[kChunk];
    load_chunk(a + r * ld + c, x);
    load_chunk(b + r * ld + c, y);
    load_chunk(dh + r * cols + c, g);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      float da, db;
      swiglu_grad(x[e], y[e], g[e], da, db);
      v[0][e] = to_f32(from_f32<T>(da));
      v[1][e] = to_f32(from_f32<T>(db));
    }
  }
};

bool rows_aligned(const Tensor& t, std::int64_t ld) { return is_aligned16(t.data()) && ld % kChunk == 0; }

template <class Src>
void launch(Resources& r, const Src& src, std::int64_t rows, std::int64_t cols, const Tensor& scale, Tensor* out,
            Tensor& out_t, const Fp8HistoryUpdate* update) {
  auto* sp = scale.data_as<float>();
  auto* op = out ? out->data_as<std::uint8_t>() : nullptr;
  auto* tp = out_t.data_as<std::uint8_t>();
  if (out_t.dtype() == DType::e4m3)
    launch_cast_transpose8<Src, Fp8Format::e4m3>(src, rows, cols, sp, op, tp, update, r.stream);
  else
    launch_cast_transpose8<Src, Fp8Format::e5m2>(src, rows, cols, sp, op, tp, update, r.stream);
  LMSCALE_CUDA_CHECK_LAUNCH();
  ++r.fp8_producer_cast_launches;
}

bool fits(std::int64_t rows, std::int64_t cols, const Tensor* out, const Tensor& out_t) {
  return rows > 0 && cols > 0 && cast_transpose8_fits(rows, cols, out ? out->data() : nullptr, out_t.data());
}

}  // namespace

bool swiglu_cast_transpose_fp8(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols,
                               std::int64_t ld, const Tensor& scale, Tensor* out, Tensor& out_t,
                               const Fp8HistoryUpdate* update) {
  if (!fits(rows, cols, out, out_t) || !rows_aligned(a, ld) || !rows_aligned(b, ld)) return false;
  Resources& r = resources(ctx);
  LMSCALE_CUDA_DISPATCH_FLOAT(a.dtype(), "swiglu_cast_transpose_fp8", T,
                              launch(r, SwigluSource<T>{a.data_as<const T>(), b.data_as<const T>(), ld}, rows, cols,
                                     scale, out, out_t, update));
  return true;
}

bool swiglu_backward_cast_transpose_fp8(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows,
                                        std::int64_t cols, std::int64_t ld, const Tensor& dh, const Tensor& scale,
                                        Tensor* out, Tensor& out_t, const Fp8HistoryUpdate* update) {
  if (!fits(rows, cols, out, out_t) || !rows_aligned(a, ld) || !rows_aligned(b, ld) || !rows_aligned(dh, cols))
    return false;
  Resources& r = resources(ctx);
  LMSCALE_CUDA_DISPATCH_FLOAT(
      a.dtype(), "swiglu_backward_cast_transpose_fp8", T,
      launch(r, SwigluGradSource<T>{a.data_as<const T>(), b.data_as<const T>(), dh.data_as<const T>(), ld, cols}, rows,
             cols, scale, out, out_t, update));
  return true;
}

}  // namespace lmscale::ops::cuda
