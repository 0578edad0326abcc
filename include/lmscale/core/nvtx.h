#pragma once
// NVTX ranges for Nsight Systems: `NvtxRange r("forward");` marks the scope. Without CUDA the
// ranges compile to nothing.
#ifdef LMSCALE_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace lmscale {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) {
#ifdef LMSCALE_WITH_CUDA
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  ~NvtxRange() {
#ifdef LMSCALE_WITH_CUDA
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace lmscale
