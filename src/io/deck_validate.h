#pragma once
// Internal: the data-parallel degree a deck resolves to (parallel.dp = 0 means "the rest").
#include <cstdint>

#include "lmscale/io/config.h"

namespace lmscale::io::detail {

// dp when given; else world_size / (tp * pp). For jobs that run the model (train, bench-model)
// tp * pp must divide the world size (UsageError otherwise); other jobs fall back to 1.
std::int64_t resolved_dp(const Config& c, int world_size);

}  // namespace lmscale::io::detail
