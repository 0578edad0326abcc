#pragma once
// Random operands for the kernel benchmarks (bench-attention, bench-gemm).
#include <cstdint>

#include "lmscale/core/tensor.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::jobs {

// Fills a tensor of any float dtype with unit normals: a 1 Mi-element random block generated once
// on the host is copied over the tensor piece by piece (random-looking data without generating
// billions of normals; never zeros, which run faster than real data). `key` picks the block.
void fill_random(ops::Runtime& rt, Tensor& t, std::uint64_t key);

}  // namespace lmscale::jobs
