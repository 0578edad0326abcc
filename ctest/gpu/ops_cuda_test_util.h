#pragma once
// Helpers for the CUDA op tests: fresh random inputs (seed printed on failure), host <-> device
// tensors in any dtype, NaN-poisoned outputs, and the relative error ||got - ref|| / ||ref||
// against a float64 CPU reference computed through the public ops:: API.
//
// Error bounds (per output dtype; the reference sees exactly the rounded inputs the GPU sees, so
// the bound covers fp32 accumulation plus one rounding of the output):
//   fp32 1e-5, bf16 1e-2, fp16 2e-3; fp32 GEMMs with TF32 allowed 2e-3.
// A NaN anywhere (an unwritten poisoned element) makes the error NaN, which fails every bound.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "lmscale/core/dtype.h"
#include "lmscale/core/tensor.h"
#include "lmscale/ops/ops.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::test {

// FP8 GEMMs need FP8 tensor cores (compute capability 8.9+); the FP8 casts run anywhere.
inline bool has_fp8_gemm() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major * 10 + minor >= 89;
}

inline double tolerance(DType t) {
  switch (t) {
    case DType::bf16: return 1e-2;
    case DType::f16: return 2e-3;
    default: return 1e-5;
  }
}

// The value `x` takes when stored in dtype `t`.
inline double round_to(double x, DType t) {
  switch (t) {
    case DType::f32: return static_cast<float>(x);
    case DType::bf16: return bf16_to_float(float_to_bf16(static_cast<float>(x)));
    case DType::f16: return f16_to_float(float_to_f16(static_cast<float>(x)));
    default: return x;
  }
}

// One GPU runtime and one CPU runtime per test, and a random source seeded afresh each run.
class CudaOpsTest : public ::testing::Test {
 protected:
  CudaOpsTest() : gpu_(Device::cuda, 0, false), cpu_(Device::cpu, 0, false) {
    seed_ = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    rng_.seed(seed_);
  }
  void SetUp() override { RecordProperty("seed", std::to_string(seed_)); }

  Context& g() { return gpu_.ctx(); }
  Context& c() { return cpu_.ctx(); }

  // n normal(0, scale) values, rounded to dtype t.
  std::vector<double> randn(std::size_t n, DType t = DType::f64, double scale = 1.0) {
    std::normal_distribution<double> d(0.0, scale);
    std::vector<double> v(n);
    for (auto& x : v) x = round_to(d(rng_), t);
    return v;
  }
  std::vector<std::int32_t> randint(std::size_t n, std::int32_t lo, std::int32_t hi) {
    std::uniform_int_distribution<std::int32_t> d(lo, hi - 1);
    std::vector<std::int32_t> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }

  // A host tensor holding `v` in dtype t.
  Tensor host(const std::vector<double>& v, const Shape& s, DType t) {
    Tensor h = Tensor::empty(s, t, cpu_.host(), "test_host");
    EXPECT_EQ(static_cast<std::size_t>(h.numel()), v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      switch (t) {
        case DType::f64: h.data_as<double>()[i] = v[i]; break;
        case DType::f32: h.data_as<float>()[i] = static_cast<float>(v[i]); break;
        case DType::bf16: h.data_as<bf16_t>()[i] = float_to_bf16(static_cast<float>(v[i])); break;
        case DType::f16: h.data_as<f16_t>()[i] = float_to_f16(static_cast<float>(v[i])); break;
        default: ADD_FAILURE() << "host(): dtype " << dtype_name(t);
      }
    }
    return h;
  }
  Tensor host_ids(const std::vector<std::int32_t>& v, const Shape& s) {
    Tensor h = Tensor::empty(s, DType::i32, cpu_.host(), "test_host");
    for (std::size_t i = 0; i < v.size(); ++i) h.data_as<std::int32_t>()[i] = v[i];
    return h;
  }
  // A float64 CPU tensor (for the reference).
  Tensor ref(const std::vector<double>& v, const Shape& s) { return host(v, s, DType::f64); }

  // A device tensor holding `v` in dtype t.
  Tensor dev(const std::vector<double>& v, const Shape& s, DType t) {
    Tensor h = host(v, s, t);
    Tensor d = Tensor::empty(s, t, gpu_.allocator(), "test_dev");
    ops::copy(g(), h, d);
    return d;
  }
  Tensor dev_ids(const std::vector<std::int32_t>& v, const Shape& s) {
    Tensor h = host_ids(v, s);
    Tensor d = Tensor::empty(s, DType::i32, gpu_.allocator(), "test_dev");
    ops::copy(g(), h, d);
    return d;
  }
  // A device tensor whose every byte is 0xFF: NaN in fp32, bf16 and fp16 (and -1 in int32).
  Tensor poisoned(const Shape& s, DType t) {
    Tensor d = Tensor::empty(s, t, gpu_.allocator(), "test_out");
    poison(d);
    return d;
  }
  void poison(Tensor& d) {
    EXPECT_EQ(cudaMemsetAsync(d.data(), 0xFF, d.nbytes(), static_cast<cudaStream_t>(g().stream)), cudaSuccess);
  }

  // Values of any float tensor (host or device) as doubles.
  std::vector<double> values(const Tensor& t) {
    Tensor h = t;
    if (t.device() == Device::cuda) {
      h = Tensor::empty(t.shape(), t.dtype(), cpu_.host(), "test_host");
      ops::copy(g(), t, h);   // waits for the stream
      EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    }
    std::vector<double> v(static_cast<std::size_t>(h.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) {
      switch (h.dtype()) {
        case DType::f64: v[i] = h.data_as<double>()[i]; break;
        case DType::f32: v[i] = h.data_as<float>()[i]; break;
        case DType::bf16: v[i] = bf16_to_float(h.data_as<bf16_t>()[i]); break;
        case DType::f16: v[i] = f16_to_float(h.data_as<f16_t>()[i]); break;
        case DType::i32: v[i] = h.data_as<std::int32_t>()[i]; break;
        default: ADD_FAILURE() << "values(): dtype " << dtype_name(h.dtype());
      }
    }
    return v;
  }

  std::uint64_t seed() const { return seed_; }

  ops::Runtime gpu_;
  ops::Runtime cpu_;

 private:
  std::uint64_t seed_;
  std::mt19937_64 rng_;
};

// ||got - ref|| / ||ref|| (NaN if got holds a NaN; ||ref|| = 0 gives the absolute norm).
inline double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  if (std::isnan(num)) return NAN;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace lmscale::test

// Expects rel_error(got, want) < tol, printing the error, the bound and the seed.
#define EXPECT_CLOSE(got, want, tol)                                                                   \
  do {                                                                                                 \
    const double _err = ::lmscale::test::rel_error((got), (want));                                     \
    EXPECT_TRUE(_err < (tol)) << "relative error " << _err << " >= " << (tol) << " (seed " << seed() << ")"; \
  } while (0)
