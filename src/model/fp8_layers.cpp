#include "lmscale/model/fp8_layers.h"

#include <fmt/ranges.h>

#include "lmscale/core/error.h"

namespace lmscale::model {

const char* fp8_gemm_name(Fp8Gemm g) {
  switch (g) {
    case Fp8Gemm::qkv: return "qkv";
    case Fp8Gemm::o: return "o";
    case Fp8Gemm::w13: return "w13";
    case Fp8Gemm::w2: return "w2";
  }
  return "?";
}

std::vector<int> fp8_gemm_params(const BlockParams& p, Fp8Gemm g) {
  switch (g) {
    case Fp8Gemm::qkv: return {p.q, p.k, p.v};
    case Fp8Gemm::o: return {p.o};
    case Fp8Gemm::w13: return {p.w1, p.w3};
    case Fp8Gemm::w2: return {p.w2};
  }
  return {};
}

void check_fp8_groups_back_to_back(const BlockParams& p, int layer) {
  for (Fp8Gemm g : kFp8BlockGemms) {
    const std::vector<int> ps = fp8_gemm_params(p, g);
    for (std::size_t i = 1; i < ps.size(); ++i)
      LMSCALE_CHECK(ps[i] == ps[i - 1] + 1,
                    "block {} FP8 layer {}: its parameters {} are not back to back in the parameter store "
                    "(model/param_layout.h holds q, k, v and w1, w3 so)",
                    layer, fp8_gemm_name(g), fmt::join(ps, ", "));
  }
}

std::vector<std::vector<int>> fp8_weight_groups(const BlockParams& p) {
  std::vector<std::vector<int>> out;
  for (Fp8Gemm g : kFp8BlockGemms) out.push_back(fp8_gemm_params(p, g));
  return out;
}

ops::Fp8LinearOptions fp8_options(const PrecisionConfig& p) {
  ops::Fp8LinearOptions o;
  o.recipe = p.fp8_scaling == Fp8Scaling::delayed ? ops::Fp8Recipe::delayed : ops::Fp8Recipe::current;
  o.history = static_cast<int>(p.fp8_history);
  o.margin = static_cast<int>(p.fp8_margin);
  o.grad_format = p.fp8_grad_format == Fp8GradFormat::e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2;
  // precision.fp8_fast_accum: forward makes the forward product fast, all the gradients' too.
  const auto fast_if = [](bool fast) { return fast ? ops::Fp8Accumulation::fast : ops::Fp8Accumulation::promoted; };
  o.forward_accumulation = fast_if(p.fp8_fast_accum != Fp8FastAccum::none);
  o.grad_accumulation = fast_if(p.fp8_fast_accum == Fp8FastAccum::all);
  return o;
}

Fp8Layers::Fp8Layers(Context& ctx, const ops::Fp8LinearOptions& options, int first_layer, int end_layer)
    : options_(options), first_(first_layer), end_(end_layer) {
  LMSCALE_CHECK(end_layer >= first_layer, "Fp8Layers: blocks [{}, {})", first_layer, end_layer);
  for (int l = 0; l < end_layer - first_layer; ++l)
    for (int g = 0; g < kFp8GemmsPerBlock; ++g) layers_.push_back(std::make_unique<ops::Fp8Linear>(ctx, options));
}

ops::Fp8Linear& Fp8Layers::at(int layer, Fp8Gemm g) {
  LMSCALE_CHECK(layer >= first_ && layer < end_, "Fp8Layers: block {} is not one of [{}, {})", layer, first_, end_);
  return *layers_[static_cast<std::size_t>((layer - first_) * kFp8GemmsPerBlock + static_cast<int>(g))];
}

const ops::Fp8Linear& Fp8Layers::at(int layer, Fp8Gemm g) const {
  return const_cast<Fp8Layers*>(this)->at(layer, g);
}

}  // namespace lmscale::model
