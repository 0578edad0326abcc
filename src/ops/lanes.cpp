// ops::for_each_lane (ops/lanes.h): on CPU the pieces in order; on CUDA cuda::for_each_lane.
#include "lmscale/ops/lanes.h"

#ifdef LMSCALE_WITH_CUDA
#include "cuda/cuda_ops.h"
#endif

namespace lmscale::ops {

void for_each_lane(Context& ctx, int n, const std::function<void(Context& lane, int i)>& work) {
#ifdef LMSCALE_WITH_CUDA
  if (ctx.device == Device::cuda) return cuda::for_each_lane(ctx, n, work);
#endif
  for (int i = 0; i < n; ++i) work(ctx, i);
}

}  // namespace lmscale::ops
