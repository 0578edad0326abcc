// The GEMMs of a dense block's training step: see include/lmscale/jobs/block_gemms.h.
#include "lmscale/jobs/block_gemms.h"

#include "lmscale/model/param_layout.h"

namespace lmscale::jobs {

std::string_view gemm_pass_name(GemmPass p) {
  switch (p) {
    case GemmPass::forward: return "forward";
    case GemmPass::data_grad: return "dx";
    case GemmPass::weight_grad: return "dW";
  }
  return "?";
}

std::vector<BlockGemm> block_gemms(const model::ModelDims& dims, std::int64_t rows) {
  const std::int64_t d = dims.d_model, F = dims.d_ff, V = dims.vocab;
  struct Layer {
    std::string_view name;
    std::int64_t group, out, in;
    bool in_block;
    std::int64_t spacing;
  };
  // The store's order of a dense block: q, k, v back to back, and w1, w3 back to back (w2 after them).
  const model::BlockParams b = model::ParamIndex(1).block(0);
  const std::int64_t qkv_spacing = b.k - b.q, w13_spacing = b.w3 - b.w1;
  // The forward's order (model/transformer.cpp block_forward), then the head.
  const Layer layers[] = {{"qkv", 3, d, d, true, qkv_spacing}, {"o", 1, d, d, true, 1},
                          {"w1w3", 2, F, d, true, w13_spacing}, {"w2", 1, d, F, true, 1},
                          {"lm_head", 1, V, d, false, 1}};
  std::vector<BlockGemm> out;
  for (const Layer& l : layers) {
    out.push_back({l.name, GemmPass::forward, l.group, rows, l.out, l.in, l.out, l.in, l.in_block, l.spacing});
    out.push_back({l.name, GemmPass::data_grad, l.group, rows, l.in, l.out, l.out, l.in, l.in_block, l.spacing});
    out.push_back({l.name, GemmPass::weight_grad, l.group, l.out, l.in, rows, l.out, l.in, l.in_block, l.spacing});
  }
  return out;
}

}  // namespace lmscale::jobs
