#pragma once
// Helpers shared by the model's CPU unit tests (test_model.cpp, test_model_moe.cpp): a host
// Context and random token batches.
#include <cstdint>
#include <random>

#include "lmscale/core/allocator.h"
#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"

namespace lmscale::test {

// A CPU context over its own counted host allocator.
struct CpuFixture {
  HostAllocator alloc;
  Context ctx;
  CpuFixture() {
    ctx.device = Device::cpu;
    ctx.allocator = &alloc;
    ctx.host = &alloc;
  }
};

// [B, T] token ids uniform in [0, V) from `seed` (mt19937).
inline Tensor int_tensor(Allocator& a, std::int64_t B, std::int64_t T, std::int64_t V, unsigned seed) {
  Tensor t = Tensor::empty({B, T}, DType::i32, a);
  std::mt19937 g(seed);
  for (std::int64_t i = 0; i < B * T; ++i) t.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(g() % V);
  return t;
}

}  // namespace lmscale::test
