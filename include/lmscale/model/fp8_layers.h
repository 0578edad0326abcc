#pragma once
// The FP8 linear layers of a model under precision.mode = fp8 (docs/precision.md, "FP8
// training"): one ops::Fp8Linear per FP8 GEMM of each block the model runs. Projections that
// read the same input and whose weights lie back to back in the parameter store run as ONE
// layer over the concatenated weight, with one w scaling and one dy scaling for the group (as
// Transformer Engine's fused QKV): q|k|v over [3dl, d] and w1|w3 over [2F, d] (the store holds
// each group back to back: ParamIndex; TransformerLM::enable_fp8 checks it). o and w2 are layers
// of their own.
// Owned by the TransformerLM that runs the blocks; nothing is shared between blocks or models.
#include <array>
#include <memory>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/io/config.h"
#include "lmscale/model/param_layout.h"
#include "lmscale/ops/fp8_linear.h"

namespace lmscale::model {

// A block's FP8 layers, in the order the forward runs them (the value indexes per-block arrays).
enum class Fp8Gemm : int { qkv, o, w13, w2 };
inline constexpr int kFp8GemmsPerBlock = 4;
inline constexpr std::array<Fp8Gemm, kFp8GemmsPerBlock> kFp8BlockGemms = {Fp8Gemm::qkv, Fp8Gemm::o, Fp8Gemm::w13,
                                                                          Fp8Gemm::w2};
// "qkv", "o", "w13", "w2" (docs/hdf5.md's /train/fp8 gemm column).
const char* fp8_gemm_name(Fp8Gemm g);
// The forward's saved operands of a block's FP8 layers (BlockActivations::fp8), indexed by Fp8Gemm.
using Fp8BlockSaved = std::array<ops::Fp8LinearSaved, kFp8GemmsPerBlock>;

// The store parameters behind layer g of a block, in the rows' order of the group's weight
// (q, k, v for qkv; w1, w3 for w13; one parameter otherwise).
std::vector<int> fp8_gemm_params(const BlockParams& p, Fp8Gemm g);
// Refuses, naming block `layer`'s FP8 layer, a group whose parameters are not consecutive in the
// store (q, k, v and w1, w3 are: ParamIndex); the FP8 layers read each group as one weight.
void check_fp8_groups_back_to_back(const BlockParams& p, int layer);
// The groups of a block's parameters that share one FP8 weight scale (fp8_gemm_params of each
// layer of kFp8BlockGemms), for fsdp's FP8 weight gathers (parallel/fsdp_fp8_gather.h).
std::vector<std::vector<int>> fp8_weight_groups(const BlockParams& p);

// Where the op producing an FP8 layer's input (or output gradient) writes that tensor's amax
// (ops::Fp8Linear::x_producer_amax / dy_producer_amax), or nothing when the layer measures it
// (docs/precision.md, "Amaxes from the producers"). Pass out() to the producing op and source()
// to the quantising call.
struct Fp8ProducerAmax {
  Tensor slot;   // [1] fp32 on the device, or undefined
  Tensor* out() { return slot.defined() ? &slot : nullptr; }
  ops::Fp8Amax source() const { return slot.defined() ? ops::Fp8Amax::from_producer : ops::Fp8Amax::measure; }
};

// Whether SwiGLU casts the w2 layer's input and the w1|w3 layer's output gradient itself
// (ops::swiglu_cast_transpose_fp8 and its backward: g and da|db are never stored in the compute
// dtype; docs/precision.md, "Casts fused into the producers"): under delayed scaling, whose scale
// is known before the pass, unless the options turn it off. The model and the memory replay ask here.
inline bool fp8_swiglu_casts_fused(const ops::Fp8LinearOptions& o) {
  return o.recipe == ops::Fp8Recipe::delayed && o.producer_casts;
}

// The deck's precision.fp8_* keys as the layers' options.
ops::Fp8LinearOptions fp8_options(const PrecisionConfig& p);

class Fp8Layers {
 public:
  // Layers for blocks [first_layer, end_layer) (a model's blocks; global layer indices).
  Fp8Layers(Context& ctx, const ops::Fp8LinearOptions& options, int first_layer, int end_layer);
  ops::Fp8Linear& at(int layer, Fp8Gemm g);
  const ops::Fp8Linear& at(int layer, Fp8Gemm g) const;
  int first_layer() const { return first_; }
  int end_layer() const { return end_; }
  const ops::Fp8LinearOptions& options() const { return options_; }

 private:
  ops::Fp8LinearOptions options_;
  int first_ = 0, end_ = 0;
  std::vector<std::unique_ptr<ops::Fp8Linear>> layers_;   // (layer - first) * kFp8GemmsPerBlock + gemm
};

}  // namespace lmscale::model
