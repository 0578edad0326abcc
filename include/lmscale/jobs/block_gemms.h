#pragma once
// The distinct GEMMs of one training step of a dense Transformer block and of the LM head, as the
// model runs them (model/transformer.cpp; docs/jobs.md, "bench-gemm"). Each linear layer
// y = x W^T with x [rows, in] and W [out, in] has three products:
//   forward      y [rows, out] = x . W^T          (M, N, K) = (rows, out, in)
//   data grad    dx [rows, in] = dy . W           (M, N, K) = (rows, in, out)
//   weight grad  dW [out, in]  = dy^T . x         (M, N, K) = (out, in, rows)
// Layers reading one input run as one group (ops::linear_side_by_side: their outputs side by side
// in one [rows, group * out] activation): q, k, v (3 products of d x d) and w1, w3 (2 of F x d);
// o (d x d), w2 (d x F) and the LM head (V x d) run alone. rows = batch * context (tokens per step
// on one device, no tensor parallelism).
#include <cstdint>
#include <string_view>
#include <vector>

#include "lmscale/model/model_dims.h"

namespace lmscale::jobs {

enum class GemmPass { forward, data_grad, weight_grad };
// "forward", "dx", "dW" (the results' `pass` column).
std::string_view gemm_pass_name(GemmPass p);

struct BlockGemm {
  std::string_view layer;   // "qkv", "o", "w1w3", "w2", "lm_head"
  GemmPass pass;
  std::int64_t group;       // products of this shape the group runs (3 for qkv, 2 for w1w3, else 1)
  std::int64_t m, n, k;     // one product's shape: [M,K] . [K,N] -> [M,N]
  std::int64_t out, in;     // the layer's weight [out, in]
  bool in_block;            // one of a block's GEMMs (false: the LM head, once per step)
  // Weights from one member of the group to the next in the parameter store, in weight sizes
  // (model::ParamIndex's order): 1 for q, k, v and for w1, w3 (back to back: one GEMM each way);
  // 1 for single layers. A spacing above 1 would time the strided per-weight products instead.
  std::int64_t spacing = 1;
  // 2 * M * N * K for each product of the group.
  double flops() const {
    return 2.0 * static_cast<double>(group) * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  }
};

// Forward, dx and dW of qkv, o, w1w3, w2, then lm_head, for `rows` token rows.
std::vector<BlockGemm> block_gemms(const model::ModelDims& dims, std::int64_t rows);

}  // namespace lmscale::jobs
