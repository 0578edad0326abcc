// The mixture-of-experts row movers on CUDA (lmscale/ops/moe.h): the
// permutation into expert order (moe_gather) and back (moe_gather_backward),
// the gated combine and its backward. One kernel each, one block per token row
// n walking its k assignments in j order (the CPU reference's order, so the
// fp32 sums of moe_gather_backward are bitwise the CPU's); 8 columns per thread
// and step with 16-byte accesses when d and the pointers allow, else scalar.
// Sums accumulate in fp32 and round once into the activation dtype; gates and
// their gradients are fp32.
#include "kernel_utils.cuh"
#include "moe_cuda.h"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace {

constexpr int kThreads = 128;

// 8 columns c8*8 .. c8*8+7 of a row of d values (zeros past d on the scalar
// path).
template <bool kVec, class T>
__device__ __forceinline__ void load8(const T* row, std::int64_t c8, std::int64_t d, float (&v)[kChunk]) {
  if constexpr (kVec) {
    load_chunk(row + c8 * kChunk, v);
  } else {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      const std::int64_t c = c8 * kChunk + e;
      v[e] = c < d ? to_f32(row[c]) : 0.f;
    }
  }
}
template <bool kVec, class T>
__device__ __forceinline__ void store8(T* row, std::int64_t c8, std::int64_t d, const float (&v)[kChunk]) {
  if constexpr (kVec) {
    store_chunk(row + c8 * kChunk, v);
  } else {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      const std::int64_t c = c8 * kChunk + e;
      if (c < d) row[c] = from_f32<T>(v[e]);
    }
  }
}

// xe[slot[n,j]] = x[n]: rows copied as words W (16, 8, 4, 2 or 1 bytes,
// whatever divides the row and the base pointers), any dtype.
template <class W>
__global__ void gather_kernel(const W* __restrict__ x, const int* __restrict__ slot, int k, std::int64_t words,
                              W* __restrict__ xe) {
  const std::int64_t n = blockIdx.x;
  for (int j = 0; j < k; ++j) {
    const int s = slot[n * k + j];
    if (s < 0) continue;
    const W* src = x + n * words;
    W* dst = xe + static_cast<std::int64_t>(s) * words;
    for (std::int64_t w = threadIdx.x; w < words; w += blockDim.x) dst[w] = src[w];
  }
}

// dx[n] = (accumulate ? dx[n] : 0) + sum over kept j, in j order, of
// dxe[slot[n,j]].
template <bool kVec, class T>
__global__ void gather_backward_kernel(const T* __restrict__ dxe, const int* __restrict__ slot, int k, std::int64_t d,
                                       bool accumulate, T* __restrict__ dx) {
  const std::int64_t n = blockIdx.x, chunks = (d + kChunk - 1) / kChunk;
  T* out = dx + n * d;
  for (std::int64_t c8 = threadIdx.x; c8 < chunks; c8 += blockDim.x) {
    float acc[kChunk] = {};
    if (accumulate) load8<kVec>(out, c8, d, acc);
    for (int j = 0; j < k; ++j) {
      const int s = slot[n * k + j];
      if (s < 0) continue;
      float v[kChunk];
      load8<kVec>(dxe + static_cast<std::int64_t>(s) * d, c8, d, v);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) acc[e] += v[e];
    }
    store8<kVec>(out, c8, d, acc);
  }
}

// out[n] = sum over kept j of gates[n,j] ye[slot[n,j]].
template <bool kVec, class T>
__global__ void combine_kernel(const T* __restrict__ ye, const int* __restrict__ slot, const float* __restrict__ gates,
                               int k, std::int64_t d, T* __restrict__ out) {
  const std::int64_t n = blockIdx.x, chunks = (d + kChunk - 1) / kChunk;
  for (std::int64_t c8 = threadIdx.x; c8 < chunks; c8 += blockDim.x) {
    float acc[kChunk] = {};
    for (int j = 0; j < k; ++j) {
      const int s = slot[n * k + j];
      if (s < 0) continue;
      const float g = gates[n * k + j];
      float v[kChunk];
      load8<kVec>(ye + static_cast<std::int64_t>(s) * d, c8, d, v);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) acc[e] += g * v[e];
    }
    store8<kVec>(out + n * d, c8, d, acc);
  }
}

// dye[slot[n,j]] = gates[n,j] dout[n]; dgates[n,j] = <dout[n], ye[slot[n,j]]>
// (0 when dropped).
template <bool kVec, class T>
__global__ void combine_backward_kernel(const T* __restrict__ dout, const T* __restrict__ ye,
                                        const int* __restrict__ slot, const float* __restrict__ gates, int k,
                                        std::int64_t d, T* __restrict__ dye, float* __restrict__ dgates) {
  __shared__ float scratch[32];
  const std::int64_t n = blockIdx.x, chunks = (d + kChunk - 1) / kChunk;
  const T* drow = dout + n * d;
  for (int j = 0; j < k; ++j) {
    const int s = slot[n * k + j];  // the same for the whole block
    if (s < 0) {
      if (threadIdx.x == 0) dgates[n * k + j] = 0.f;
      continue;
    }
    const float g = gates[n * k + j];
    const T* yrow = ye + static_cast<std::int64_t>(s) * d;
    T* dyrow = dye + static_cast<std::int64_t>(s) * d;
    float dot = 0.f;
    for (std::int64_t c8 = threadIdx.x; c8 < chunks; c8 += blockDim.x) {
      float dv[kChunk], yv[kChunk], out[kChunk];
      load8<kVec>(drow, c8, d, dv);
      load8<kVec>(yrow, c8, d, yv);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        dot += dv[e] * yv[e];
        out[e] = g * dv[e];
      }
      store8<kVec>(dyrow, c8, d, out);
    }
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0) dgates[n * k + j] = dot;
  }
}

bool vec_ok(std::int64_t d, std::initializer_list<const Tensor*> ts) {
  if (d % kChunk != 0) return false;
  for (const Tensor* t : ts)
    if (!is_aligned16(t->data())) return false;
  return true;
}

void check_gates(const char* op, const Tensor& g) {
  LMSCALE_CHECK(g.dtype() == DType::f32, "{}: gates and their gradients must be fp32 on CUDA, got {}", op,
                dtype_name(g.dtype()));
}

template <class W>
void launch_gather(Context& ctx, const Tensor& x, const Tensor& slot, Tensor& xe, std::int64_t N, std::int64_t row) {
  gather_kernel<W><<<static_cast<unsigned>(N), kThreads, 0, stream(ctx)>>>(
      static_cast<const W*>(x.data()), slot.data_as<const int>(), static_cast<int>(slot.dim(1)),
      row / static_cast<std::int64_t>(sizeof(W)), static_cast<W*>(xe.data()));
}

}  // namespace

void moe_gather(Context& ctx, const Tensor& x, const Tensor& slot, Tensor& xe) {
  const std::int64_t N = x.dim(0);
  if (N == 0 || xe.dim(0) == 0 || x.dim(1) == 0) return;
  const std::int64_t row = x.dim(1) * static_cast<std::int64_t>(dtype_size(x.dtype()));
  const auto fits = [&](std::int64_t w) {
    return row % w == 0 && reinterpret_cast<std::uintptr_t>(x.data()) % w == 0 &&
           reinterpret_cast<std::uintptr_t>(xe.data()) % w == 0;
  };
  if (fits(16))
    launch_gather<uint4>(ctx, x, slot, xe, N, row);
  else if (fits(8))
    launch_gather<uint2>(ctx, x, slot, xe, N, row);
  else if (fits(4))
    launch_gather<unsigned>(ctx, x, slot, xe, N, row);
  else if (fits(2))
    launch_gather<unsigned short>(ctx, x, slot, xe, N, row);
  else
    launch_gather<unsigned char>(ctx, x, slot, xe, N, row);
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void moe_gather_backward(Context& ctx, const Tensor& dxe, const Tensor& slot, Tensor& dx, bool accumulate) {
  const std::int64_t N = dx.dim(0), d = dx.dim(1);
  if (N == 0 || d == 0) return;
  const int k = static_cast<int>(slot.dim(1));
  const bool vec = vec_ok(d, {&dxe, &dx});
  LMSCALE_CUDA_DISPATCH_FLOAT(dx.dtype(), "ops::moe_gather_backward", T, {
    if (vec)
      gather_backward_kernel<true, T><<<static_cast<unsigned>(N), kThreads, 0, stream(ctx)>>>(
          dxe.data_as<const T>(), slot.data_as<const int>(), k, d, accumulate, dx.data_as<T>());
    else
      gather_backward_kernel<false, T><<<static_cast<unsigned>(N), kThreads, 0, stream(ctx)>>>(
          dxe.data_as<const T>(), slot.data_as<const int>(), k, d, accumulate, dx.data_as<T>());
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void moe_combine(Context& ctx, const Tensor& ye, const Tensor& slot, const Tensor& gates, Tensor& out) {
  check_gates("ops::moe_combine", gates);
  const std::int64_t N = out.dim(0), d = out.dim(1);
  if (N == 0 || d == 0) return;
  const int k = static_cast<int>(slot.dim(1));
  const bool vec = vec_ok(d, {&ye, &out});
  LMSCALE_CUDA_DISPATCH_FLOAT(out.dtype(), "ops::moe_combine", T, {
    if (vec)
      combine_kernel<true, T><<<static_cast<unsigned>(N), kThreads, 0, stream(ctx)>>>(
          ye.data_as<const T>(), slot.data_as<const int>(), gates.data_as<const float>(), k, d, out.data_as<T>());
    else
      combine_kernel<false, T><<<static_cast<unsigned>(N), kThreads, 0, stream(ctx)>>>(
          ye.data_as<const T>(), slot.data_as<const int>(), gates.data_as<const float>(), k, d, out.data_as<T>());
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
}

void moe_combine_backward(Context& ctx, const Tensor& dout, const Tensor& ye, const Tensor& slot, const Tensor& gates,
                          Tensor& dye, Tensor& dgates) {
  check_gates("ops::moe_combine_backward", gates);
  check_gates("ops::moe_combine_backward", dgates);
  const std::int64_t N = dout.dim(0), d = dout.dim(1);
  if (N == 0) return;
  const int k = static_cast<int>(slot.dim(1));
  const bool vec = vec_ok(d, {&dout, &ye, &dye});
  LMSCALE_CUDA_DISPATCH_FLOAT(dout.dtype(), "ops::moe_combine_backward", T, {
    if (vec)
      combine_backward_kernel<true, T><<<static_cast<unsigned>(N), kThreads, 0, stream(ctx)>>>(
          dout.data_as<const T>(), ye.data_as<const T>(), slot.data_as<const int>(), gates.data_as<const float>(), k, d,
          dye.data_as<T>(), dgates.data_as<float>());
    else
      combine_backward_kernel<false, T><<<static_cast<unsigned>(N), kThreads, 0, stream(ctx)>>>(
          dout.data_as<const T>(), ye.data_as<const T>(), slot.data_as<const int>(), gates.data_as<const float>(), k, d,
          dye.data_as<T>(), dgates.data_as<float>());
  });
  LMSCALE_CUDA_CHECK_LAUNCH();
}

}  // namespace lmscale::ops::cuda
