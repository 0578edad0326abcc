#pragma once
// Independent pieces of work run side by side on one device ("lanes"): on CUDA each lane is a
// stream of its own with its own cuBLASLt handle, workspace and plan cache (ops/cuda/resources.h),
// forked from the compute stream and joined back into it, so GEMMs too small to fill the GPU alone
// (an MoE expert's ~2k rows leave part of the last wave of tiles idle) overlap each other's tails.
// On CPU the pieces run one after the other on ctx itself.
//
// Rules for `work`: piece i touches only its own outputs (no two pieces write the same bytes),
// takes its context from the lane it is given, and allocates nothing: the allocator is ordered on
// the compute stream (core/cuda/device_allocator.h), so a buffer freed on one lane could be handed
// to another while the first still uses it. Tensors the pieces need are made before the call and
// released after it (the compute stream waits for every lane before it returns). The pieces'
// arithmetic is what it would be on the compute stream: each product keeps its own plan, so
// results do not depend on the lane that ran it.
#include <functional>

#include "lmscale/core/context.h"

namespace lmscale::ops {

// Runs work(lane, i) for i = 0 .. n-1, piece i on lane i % L (L = min(n, the device's lane
// count)); returns with the compute stream ordered after all of them.
void for_each_lane(Context& ctx, int n, const std::function<void(Context& lane, int i)>& work);

}  // namespace lmscale::ops
