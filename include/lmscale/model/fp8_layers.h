#pragma once
// The FP8 linear layers of a model under precision.mode = fp8 (docs/precision.md, "FP8
// training"): one ops::Fp8Linear per dense linear layer of each block the model runs (q, k, v, o
// of the attention; w1, w3, w2 of the SwiGLU), each with its own w and dy scalings. Layers that
// read the same input share one quantisation of it under one x scaling (ops::Fp8Input): q's for
// q, k, v (the attention norm's output), w1's for w1, w3 (the FFN norm's); o and w2 own theirs.
// Owned by the TransformerLM that runs the blocks; nothing is shared between blocks or models.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/io/config.h"
#include "lmscale/ops/fp8_linear.h"

namespace lmscale::model {

// A block's FP8 linear layers, in the order the forward runs them.
enum class Fp8Gemm : int { q, k, v, o, w1, w3, w2 };
inline constexpr int kFp8GemmsPerBlock = 7;
// "q", "k", "v", "o", "w1", "w3", "w2" (the parameter names' last part; docs/hdf5.md).
const char* fp8_gemm_name(Fp8Gemm g);
// The forward's saved operands of a block's FP8 layers (BlockActivations::fp8), indexed by Fp8Gemm.
using Fp8BlockSaved = std::array<ops::Fp8LinearSaved, kFp8GemmsPerBlock>;

// The layer whose x scaling quantises layer g's input: q for q, k, v; w1 for w1, w3; else g.
Fp8Gemm fp8_input_owner(Fp8Gemm g);

// The deck's precision.fp8_* keys as the layers' options.
ops::Fp8LinearOptions fp8_options(const PrecisionConfig& p);

class Fp8Layers {
 public:
  // Layers for blocks [first_layer, end_layer) (a model's blocks; global layer indices).
  Fp8Layers(Context& ctx, const ops::Fp8LinearOptions& options, int first_layer, int end_layer);
  ops::Fp8Linear& at(int layer, Fp8Gemm g);
  const ops::Fp8Linear& at(int layer, Fp8Gemm g) const;
  // The x scaling that quantises layer g's input (its input owner's).
  const ops::Fp8TensorScaling& x_scaling(int layer, Fp8Gemm g) const {
    return at(layer, fp8_input_owner(g)).x_scaling();
  }
  int first_layer() const { return first_; }
  int end_layer() const { return end_; }
  const ops::Fp8LinearOptions& options() const { return options_; }

 private:
  ops::Fp8LinearOptions options_;
  int first_ = 0, end_ = 0;
  std::vector<std::unique_ptr<ops::Fp8Linear>> layers_;   // (layer - first) * kFp8GemmsPerBlock + gemm
};

}  // namespace lmscale::model
