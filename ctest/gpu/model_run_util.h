#pragma once
// Shared by the model's GPU tests (test_model_cuda.cpp, test_model_moe_cuda.cpp, the FP8 and CUDA
// graph tests): one forward and backward of a TransformerLM on either device from the same token
// rows, so CPU and CUDA runs compare the same work; random token rows; the process's one MPI
// environment for the tests that build a Trainer.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "lmscale/comm/mpi_environment.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/ops.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::test {

struct LossAndGrads {
  double loss = 0;            // mean over the B*T targets
  std::vector<float> grads;   // fp32 [ps.numel()], the store's flat layout
};

// tok: B rows of T+1 ids; the inputs are each row's first T, the targets the next T. Copies the
// batch to the runtime's device, runs forward (loss scale 1/(B T)) and backward, reads the loss
// and the gradients back. The caller reads anything else (e.g. MoE statistics) from `m` after.
inline LossAndGrads forward_backward(ops::Runtime& rt, model::TransformerLM& m, model::ParameterStore& ps,
                                     const std::vector<std::int32_t>& tok, std::int64_t B, std::int64_t T) {
  Context& ctx = rt.ctx();
  Tensor xh = Tensor::empty({B, T}, DType::i32, rt.host()), yh = Tensor::empty({B, T}, DType::i32, rt.host());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t) {
      xh.data_as<std::int32_t>()[b * T + t] = tok[static_cast<std::size_t>(b * (T + 1) + t)];
      yh.data_as<std::int32_t>()[b * T + t] = tok[static_cast<std::size_t>(b * (T + 1) + t + 1)];
    }
  Tensor x = xh, y = yh;
  if (rt.device() == Device::cuda) {
    x = Tensor::empty({B, T}, DType::i32, rt.allocator());
    y = Tensor::empty({B, T}, DType::i32, rt.allocator());
    ops::copy(ctx, xh, x);
    ops::copy(ctx, yh, y);
  }
  auto act = m.forward(ctx, x, y, true, 1.0 / static_cast<double>(B * T));
  Tensor lh = Tensor::empty({1}, act->loss_sum.dtype(), rt.host());
  ops::copy(ctx, act->loss_sum, lh);
  m.backward(ctx, *act, {});
  LossAndGrads r;
  r.grads.resize(static_cast<std::size_t>(ps.numel()));
  Tensor gh = Tensor::view(r.grads.data(), {ps.numel()}, DType::f32, Device::cpu);
  ops::copy(ctx, ps.flat_grads(), gh);
  rt.synchronize();
  r.loss = lh.data_as<float>()[0] / static_cast<double>(B * T);
  return r;
}

// B rows of T + 1 token ids uniform in [0, V) from `seed`.
inline std::vector<std::int32_t> tokens(std::int64_t B, std::int64_t T, std::int64_t V, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<std::int32_t> v(static_cast<std::size_t>(B * (T + 1)));
  for (auto& x : v) x = static_cast<std::int32_t>(g() % V);
  return v;
}

// One MPI environment per process (MPI cannot be initialised again after finalize).
inline comm::MpiEnvironment& mpi_once() {
  static comm::MpiEnvironment mpi(nullptr, nullptr);
  return mpi;
}

// Relative 2-norm error of a[off, off+n) against b[off, off+n).
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b, std::int64_t off, std::int64_t n) {
  double num = 0, den = 0;
  for (std::int64_t i = off; i < off + n; ++i) {
    const double d = static_cast<double>(a[static_cast<std::size_t>(i)]) - b[static_cast<std::size_t>(i)];
    num += d * d;
    den += static_cast<double>(b[static_cast<std::size_t>(i)]) * b[static_cast<std::size_t>(i)];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace lmscale::test
