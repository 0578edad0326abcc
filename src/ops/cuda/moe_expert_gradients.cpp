// zero_empty_expert_gradients (moe_expert_gradients.h).
#include "moe_expert_gradients.h"

#include <cuda_runtime.h>

#include "lmscale/core/cuda/cuda_check.h"
#include "resources.h"

namespace lmscale::ops::cuda {

void zero_empty_expert_gradients(Context& ctx, const std::vector<std::int64_t>& rows,
                                 std::initializer_list<Tensor*> stacks) {
  const cudaStream_t stream = resources(ctx).stream;
  for (std::size_t e = 0; e < rows.size(); ++e) {
    if (rows[e] != 0) continue;
    for (Tensor* G : stacks) {
      const std::size_t bytes = static_cast<std::size_t>(G->dim(1) * G->dim(2)) * dtype_size(G->dtype());
      LMSCALE_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(G->data()) + e * bytes, 0, bytes, stream));
    }
  }
}

}  // namespace lmscale::ops::cuda
