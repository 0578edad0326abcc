#pragma once
// The weight gradients of the experts that got no rows, for the grouped forms of the MoE experts'
// backward (moe_experts_grouped.cpp, moe_experts_wgmma.cpp): such an expert has no products, so
// nothing writes its matrices; when the backward overwrites (not accumulate) they must still
// become zero.
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"

namespace lmscale::ops::cuda {

// Zeroes matrix e of every stacked gradient [El, r, c] of `stacks` for each expert e with
// rows[e] == 0, on the context's compute stream.
void zero_empty_expert_gradients(Context& ctx, const std::vector<std::int64_t>& rows,
                                 std::initializer_list<Tensor*> stacks);

}  // namespace lmscale::ops::cuda
