// tensor_map.h: the driver's cuTensorMapEncodeTiled, fetched once through the runtime.
#include "tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

namespace lmscale::ops::cuda {

TensorMapEncoder tensor_map_encoder() {
  static const TensorMapEncoder fn = []() -> TensorMapEncoder {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      return nullptr;
    return reinterpret_cast<TensorMapEncoder>(reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr));
  }();
  return fn;
}

}  // namespace lmscale::ops::cuda
