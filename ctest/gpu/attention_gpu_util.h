#pragma once
// Host-side helpers for the CUDA attention tests: random inputs rounded to a dtype, device
// upload/download with conversion, NaN poisoning, relative errors.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "lmscale/core/dtype.h"
#include "lmscale/core/rng.h"
#include "lmscale/core/tensor.h"

namespace attn_test {

using lmscale::DType;

inline void cuda_ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// Value of x after rounding to dtype d.
inline double round_to(double x, DType d) {
  const float f = static_cast<float>(x);
  if (d == DType::bf16) return lmscale::bf16_to_float(lmscale::float_to_bf16(f));
  if (d == DType::f16) return lmscale::f16_to_float(lmscale::float_to_f16(f));
  if (d == DType::f32) return f;
  return x;
}

// n standard normals (stream `key`), already rounded to d so the reference sees the same inputs.
inline std::vector<double> random_rounded(std::int64_t n, std::uint64_t seed, std::uint64_t key, DType d) {
  lmscale::CounterRng rng(seed, key);
  std::vector<double> x(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] = round_to(rng.normal(static_cast<std::uint64_t>(i)), d);
  return x;
}

inline std::vector<unsigned char> encode(const std::vector<double>& x, DType d) {
  std::vector<unsigned char> bytes(x.size() * lmscale::dtype_size(d));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float f = static_cast<float>(x[i]);
    if (d == DType::f32) std::memcpy(&bytes[i * 4], &f, 4);
    else if (d == DType::bf16) { auto h = lmscale::float_to_bf16(f); std::memcpy(&bytes[i * 2], &h.bits, 2); }
    else { auto h = lmscale::float_to_f16(f); std::memcpy(&bytes[i * 2], &h.bits, 2); }
  }
  return bytes;
}

inline std::vector<double> decode(const std::vector<unsigned char>& bytes, DType d) {
  const std::size_t n = bytes.size() / lmscale::dtype_size(d);
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (d == DType::f32) { float f; std::memcpy(&f, &bytes[i * 4], 4); x[i] = f; }
    else if (d == DType::bf16) { lmscale::bf16_t h; std::memcpy(&h.bits, &bytes[i * 2], 2); x[i] = lmscale::bf16_to_float(h); }
    else { lmscale::f16_t h; std::memcpy(&h.bits, &bytes[i * 2], 2); x[i] = lmscale::f16_to_float(h); }
  }
  return x;
}

inline void upload(const std::vector<double>& x, lmscale::Tensor& t) {
  const auto bytes = encode(x, t.dtype());
  ASSERT_EQ(bytes.size(), t.nbytes());
  cuda_ok(cudaMemcpy(t.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  cuda_ok(cudaDeviceSynchronize());   // see poison
}

inline std::vector<double> download(const lmscale::Tensor& t) {
  std::vector<unsigned char> bytes(t.nbytes());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(bytes.data(), t.data(), bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return decode(bytes, t.dtype());
}

// All bits set: NaN in fp32, bf16 and fp16, so an element the kernel never writes fails the check.
// The memset runs on the legacy default stream, which does not order against the runtime's
// non-blocking stream: without the synchronisation it could land after the kernel under test had
// written its output (seen with another process on the GPU: naive O "inf" in 8 cases, ctest -j2).
inline void poison(lmscale::Tensor& t) {
  cuda_ok(cudaMemset(t.data(), 0xFF, t.nbytes()));
  cuda_ok(cudaDeviceSynchronize());
}

// ||a - b|| / max(||b||, 0.01 * sqrt(n)); infinity when a holds a NaN or inf. The floor is 1% of
// the norm of unit-scale data: for T = 1, dQ and dK vanish exactly and the kernels return
// cancellation residue of ~1e-6 per element, which a pure relative error would magnify without bound.
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 0.01 * std::sqrt(static_cast<double>(b.size())));
}

}  // namespace attn_test
