#pragma once
// The random stream of one sample of one batch: a pure function of (step, global sample index,
// train/eval), shared by every token source so that all rank layouts see the same global batch.
#include <cstdint>

#include "lmscale/core/rng.h"

namespace lmscale::io::detail {

constexpr std::uint64_t kEvalKey = 0xe7a1e7a1e7a1ull;
inline std::uint64_t sample_key(std::uint64_t step, std::int64_t index, bool eval) {
  return splitmix64(step * 0x100000001b3ull + static_cast<std::uint64_t>(index)) ^ (eval ? kEvalKey : 0);
}

}  // namespace lmscale::io::detail
