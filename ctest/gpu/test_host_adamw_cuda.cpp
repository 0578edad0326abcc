// The host AdamW of parallel.offload = optimizer (ops/host_adamw.h, AdamWArithmetic::cuda_kernel)
// against the CUDA AdamW kernel on the same inputs: p, m, v and the bf16/fp16 working copy bit for
// bit, for sizes with and without the kernel's 8-element chunks and for unaligned views (the
// kernel's scalar path). A mismatch means nvcc's contraction of the kernel changed (read its SASS,
// host_adamw.h says how).
#include <cuda_runtime.h>

#include <cstring>

#include "lmscale/ops/host_adamw.h"
#include "ops_cuda_test_util.h"

namespace lmscale::test {
namespace {

TEST_F(CudaOpsTest, HostAdamWMatchesCudaKernelBitwise) {
  for (const std::int64_t n : {std::int64_t{1} << 16, std::int64_t{100003}, std::int64_t{13}})
    for (const std::int64_t off : {0, 1})
      for (const DType lowp : {DType::bf16, DType::f16}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " off=" << off << " " << dtype_name(lowp));
        const auto p = randn(static_cast<std::size_t>(n + off), DType::f32, 0.5),
                   gr = randn(static_cast<std::size_t>(n + off), DType::f32, 2.0),
                   m = randn(static_cast<std::size_t>(n + off), DType::f32, 0.1);
        auto v = randn(static_cast<std::size_t>(n + off), DType::f32, 0.01);
        for (double& x : v) x = std::fabs(x);
        ops::AdamWStep a;
        a.lr = 3e-3, a.beta1 = 0.9, a.beta2 = 0.95, a.eps = 1e-8, a.weight_decay = 0.1, a.grad_scale = 0.37;
        a.step = 7;
        Tensor pd = dev(p, {n + off}, DType::f32).flat_range(off, n), gd = dev(gr, {n + off}, DType::f32).flat_range(off, n);
        Tensor md = dev(m, {n + off}, DType::f32).flat_range(off, n), vd = dev(v, {n + off}, DType::f32).flat_range(off, n);
        Tensor low = poisoned({n + off}, lowp).flat_range(off, n);
        ops::adamw(g(), pd, gd, md, vd, a, &low);
        Tensor ph = host(p, {n + off}, DType::f32).flat_range(off, n), gh = host(gr, {n + off}, DType::f32).flat_range(off, n);
        Tensor mh = host(m, {n + off}, DType::f32).flat_range(off, n), vh = host(v, {n + off}, DType::f32).flat_range(off, n);
        Tensor lowh = host(std::vector<double>(static_cast<std::size_t>(n), 0.0), {n}, lowp);
        ops::adamw_host(ph, gh, mh, vh, a, &lowh, ops::AdamWArithmetic::cuda_kernel, 4);
        auto same_bits = [&](const Tensor& d, const Tensor& h, const char* what) {
          std::vector<unsigned char> bytes(d.nbytes());
          Tensor view = Tensor::view(bytes.data(), {d.numel()}, d.dtype(), Device::cpu);
          ops::copy(g(), d, view);
          cudaDeviceSynchronize();
          std::int64_t wrong = 0;
          const std::size_t es = dtype_size(d.dtype());
          for (std::int64_t i = 0; i < d.numel(); ++i)
            wrong += std::memcmp(bytes.data() + i * es, static_cast<const unsigned char*>(h.data()) + i * es, es) != 0;
          EXPECT_EQ(wrong, 0) << what << ": elements whose bits differ from the CUDA kernel's";
        };
        same_bits(pd, ph, "p");
        same_bits(md, mh, "m");
        same_bits(vd, vh, "v");
        same_bits(low, lowh, "working copy");
      }
}

}  // namespace
}  // namespace lmscale::test
