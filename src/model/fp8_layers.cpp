#include "lmscale/model/fp8_layers.h"

#include "lmscale/core/error.h"

namespace lmscale::model {

const char* fp8_gemm_name(Fp8Gemm g) {
  switch (g) {
    case Fp8Gemm::q: return "q";
    case Fp8Gemm::k: return "k";
    case Fp8Gemm::v: return "v";
    case Fp8Gemm::o: return "o";
    case Fp8Gemm::w1: return "w1";
    case Fp8Gemm::w3: return "w3";
    case Fp8Gemm::w2: return "w2";
  }
  return "?";
}

Fp8Gemm fp8_input_owner(Fp8Gemm g) {
  switch (g) {
    case Fp8Gemm::k:
    case Fp8Gemm::v: return Fp8Gemm::q;
    case Fp8Gemm::w3: return Fp8Gemm::w1;
    default: return g;
  }
}

ops::Fp8LinearOptions fp8_options(const PrecisionConfig& p) {
  ops::Fp8LinearOptions o;
  o.recipe = p.fp8_scaling == Fp8Scaling::delayed ? ops::Fp8Recipe::delayed : ops::Fp8Recipe::current;
  o.history = static_cast<int>(p.fp8_history);
  o.margin = static_cast<int>(p.fp8_margin);
  o.grad_format = p.fp8_grad_format == Fp8GradFormat::e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2;
  return o;
}

Fp8Layers::Fp8Layers(Context& ctx, const ops::Fp8LinearOptions& options, int first_layer, int end_layer)
    : options_(options), first_(first_layer), end_(end_layer) {
  LMSCALE_CHECK(end_layer >= first_layer, "Fp8Layers: blocks [{}, {})", first_layer, end_layer);
  for (int i = 0; i < (end_layer - first_layer) * kFp8GemmsPerBlock; ++i) {
    const auto g = static_cast<Fp8Gemm>(i % kFp8GemmsPerBlock);
    layers_.push_back(std::make_unique<ops::Fp8Linear>(ctx, options, fp8_input_owner(g) == g));
  }
}

ops::Fp8Linear& Fp8Layers::at(int layer, Fp8Gemm g) {
  LMSCALE_CHECK(layer >= first_ && layer < end_, "Fp8Layers: block {} is not one of [{}, {})", layer, first_, end_);
  return *layers_[static_cast<std::size_t>((layer - first_) * kFp8GemmsPerBlock + static_cast<int>(g))];
}

const ops::Fp8Linear& Fp8Layers::at(int layer, Fp8Gemm g) const {
  return const_cast<Fp8Layers*>(this)->at(layer, g);
}

}  // namespace lmscale::model
