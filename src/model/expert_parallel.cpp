// The local parameter layout of an expert-parallel rank (model/expert_parallel.h): the stacked
// expert tensors of the MoE blocks cut to the rank's experts.
#include "lmscale/model/expert_parallel.h"

#include "lmscale/core/error.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/tensor_parallel.h"

namespace lmscale::model {

bool is_expert_parameter(const ParamInfo& p) { return p.name.find(".ffn.experts.") != std::string::npos; }

std::vector<ParamInfo> expert_parallel_layout(std::vector<ParamInfo> layout, const ModelDims& dims,
                                              const ExpertSplit& experts) {
  if (!experts.active()) return layout;
  LMSCALE_CHECK(dims.moe() && dims.moe_experts % experts.degree == 0 && experts.rank >= 0 &&
                    experts.rank < experts.degree,
                "expert parallel rank {} of {} for {} experts", experts.rank, experts.degree, dims.moe_experts);
  std::int64_t off = 0;
  for (ParamInfo& p : layout) {
    if (is_expert_parameter(p)) {
      LMSCALE_CHECK(p.split_dim < 0, "{}: an expert tensor cannot also be tensor-parallel", p.name);
      p.split_dim = 0;
      p.split_begin = experts.begin(p.full_shape[0]);
      p.shape[0] = experts.local(p.full_shape[0]);
      p.numel = shape_numel(p.shape);
    }
    p.offset = off;
    off += p.numel;
  }
  return layout;
}

}  // namespace lmscale::model
