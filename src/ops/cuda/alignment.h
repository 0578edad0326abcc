#pragma once
// Whether a pointer is 16-byte aligned: the vectorised kernels' 16-byte loads (kernel_utils.cuh)
// and the TMA copies' base addresses need it. A plain host header, so the host-compiled sources
// (the Hopper kernels' rules, .cpp) and the kernels' .cu files share one definition.
#include <cstdint>

namespace lmscale::ops::cuda {

inline bool is_aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

}  // namespace lmscale::ops::cuda
