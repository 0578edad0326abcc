#pragma once
// The FP8 linear layers of a model under precision.mode = fp8 (docs/precision.md, "FP8
// training"): one ops::Fp8Linear per FP8 GEMM of each block the model runs. Projections that
// read the same input and whose weights lie back to back in the parameter store run as ONE
// layer over the concatenated weight, with one w scaling and one dy scaling for the group (as
// Transformer Engine's fused QKV): q|k|v over [3dl, d] (always adjacent: the store's order),
// and w1|w3 over [2F, d] when the store holds w3 right after w1 (ParamIndex; else w1 and w3 stay
// two layers sharing w1's input quantisation, ops::Fp8Input). o and w2 are layers of their own.
// Owned by the TransformerLM that runs the blocks; nothing is shared between blocks or models.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/io/config.h"
#include "lmscale/model/param_layout.h"
#include "lmscale/ops/fp8_linear.h"

namespace lmscale::model {

// The FP8 layer slots of a block. A block runs {qkv, o, w13, w2} when w1 and w3 are adjacent in
// the store, else {qkv, o, w1, w3, w2} (Fp8Layers::gemms()); the other slots stay unused.
enum class Fp8Gemm : int { qkv, o, w13, w2, w1, w3 };
inline constexpr int kFp8GemmSlots = 6;
// "qkv", "o", "w13", "w2", "w1", "w3" (docs/hdf5.md's /train/fp8 gemm column).
const char* fp8_gemm_name(Fp8Gemm g);
// The forward's saved operands of a block's FP8 layers (BlockActivations::fp8), indexed by Fp8Gemm.
using Fp8BlockSaved = std::array<ops::Fp8LinearSaved, kFp8GemmSlots>;

// The layer whose x scaling quantises layer g's input: w1 for w3 (split FFN), else g itself.
Fp8Gemm fp8_input_owner(Fp8Gemm g);

// Whether the FFN's w1 and w3 of block l form one FP8 layer: w3 right after w1 in the store.
inline bool fp8_w13_grouped(const BlockParams& p) { return p.w3 == p.w1 + 1; }
// The store parameters behind layer g of a block, in the rows' order of the group's weight
// (q, k, v for qkv; w1, w3 for w13; one parameter otherwise).
std::vector<int> fp8_gemm_params(const BlockParams& p, Fp8Gemm g);
// A block's FP8 layers in the order the forward runs them.
std::vector<Fp8Gemm> fp8_block_gemms(bool w13_grouped);
// The groups of a block's parameters that share one FP8 weight scale (fp8_gemm_params of each
// layer of fp8_block_gemms), for fsdp's FP8 weight gathers (parallel/fsdp_fp8_gather.h).
std::vector<std::vector<int>> fp8_weight_groups(const BlockParams& p);

// The deck's precision.fp8_* keys as the layers' options.
ops::Fp8LinearOptions fp8_options(const PrecisionConfig& p);

class Fp8Layers {
 public:
  // Layers for blocks [first_layer, end_layer) (a model's blocks; global layer indices); w1|w3
  // one layer when w13_grouped.
  Fp8Layers(Context& ctx, const ops::Fp8LinearOptions& options, int first_layer, int end_layer, bool w13_grouped);
  ops::Fp8Linear& at(int layer, Fp8Gemm g);
  const ops::Fp8Linear& at(int layer, Fp8Gemm g) const;
  // The x scaling that quantises layer g's input (its input owner's).
  const ops::Fp8TensorScaling& x_scaling(int layer, Fp8Gemm g) const {
    return at(layer, fp8_input_owner(g)).x_scaling();
  }
  // The layers each block runs, in forward order (fp8_block_gemms).
  const std::vector<Fp8Gemm>& gemms() const { return gemms_; }
  bool w13_grouped() const { return w13_grouped_; }
  int first_layer() const { return first_; }
  int end_layer() const { return end_; }
  const ops::Fp8LinearOptions& options() const { return options_; }

 private:
  ops::Fp8LinearOptions options_;
  int first_ = 0, end_ = 0;
  bool w13_grouped_ = false;
  std::vector<Fp8Gemm> gemms_;
  std::vector<std::unique_ptr<ops::Fp8Linear>> layers_;   // (layer - first) * kFp8GemmSlots + slot; null if unused
};

}  // namespace lmscale::model
