#pragma once
// TMA tensor maps (CUtensorMap) for the Hopper kernels: the flash attention kernels
// (flash_attention_sm90.cpp) and the grouped GEMM (grouped_gemm_sm90.h). The encoder is a driver
// function; it is fetched through the runtime (cudaGetDriverEntryPointByVersion) so the library
// does not link libcuda itself.
#include <cuda.h>

namespace lmscale::ops::cuda {

using TensorMapEncoder = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                      const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                      CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled of the driver (looked up once per process), or null when the driver has
// none.
TensorMapEncoder tensor_map_encoder();

}  // namespace lmscale::ops::cuda
