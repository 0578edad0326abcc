#include "lmscale/model/fp8_layers.h"

#include <algorithm>

#include "lmscale/core/error.h"

namespace lmscale::model {

const char* fp8_gemm_name(Fp8Gemm g) {
  switch (g) {
    case Fp8Gemm::qkv: return "qkv";
    case Fp8Gemm::o: return "o";
    case Fp8Gemm::w13: return "w13";
    case Fp8Gemm::w2: return "w2";
    case Fp8Gemm::w1: return "w1";
    case Fp8Gemm::w3: return "w3";
  }
  return "?";
}

Fp8Gemm fp8_input_owner(Fp8Gemm g) { return g == Fp8Gemm::w3 ? Fp8Gemm::w1 : g; }

std::vector<int> fp8_gemm_params(const BlockParams& p, Fp8Gemm g) {
  switch (g) {
    case Fp8Gemm::qkv: return {p.q, p.k, p.v};
    case Fp8Gemm::o: return {p.o};
    case Fp8Gemm::w13: return {p.w1, p.w3};
    case Fp8Gemm::w2: return {p.w2};
    case Fp8Gemm::w1: return {p.w1};
    case Fp8Gemm::w3: return {p.w3};
  }
  return {};
}

std::vector<Fp8Gemm> fp8_block_gemms(bool w13_grouped) {
  using G = Fp8Gemm;
  return w13_grouped ? std::vector<G>{G::qkv, G::o, G::w13, G::w2} : std::vector<G>{G::qkv, G::o, G::w1, G::w3, G::w2};
}

std::vector<std::vector<int>> fp8_weight_groups(const BlockParams& p) {
  std::vector<std::vector<int>> out;
  for (Fp8Gemm g : fp8_block_gemms(fp8_w13_grouped(p))) out.push_back(fp8_gemm_params(p, g));
  return out;
}

ops::Fp8LinearOptions fp8_options(const PrecisionConfig& p) {
  ops::Fp8LinearOptions o;
  o.recipe = p.fp8_scaling == Fp8Scaling::delayed ? ops::Fp8Recipe::delayed : ops::Fp8Recipe::current;
  o.history = static_cast<int>(p.fp8_history);
  o.margin = static_cast<int>(p.fp8_margin);
  o.grad_format = p.fp8_grad_format == Fp8GradFormat::e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2;
  return o;
}

Fp8Layers::Fp8Layers(Context& ctx, const ops::Fp8LinearOptions& options, int first_layer, int end_layer,
                     bool w13_grouped)
    : options_(options), first_(first_layer), end_(end_layer), w13_grouped_(w13_grouped),
      gemms_(fp8_block_gemms(w13_grouped)) {
  LMSCALE_CHECK(end_layer >= first_layer, "Fp8Layers: blocks [{}, {})", first_layer, end_layer);
  layers_.resize(static_cast<std::size_t>((end_layer - first_layer) * kFp8GemmSlots));
  for (int l = 0; l < end_layer - first_layer; ++l)
    for (Fp8Gemm g : gemms_)
      layers_[static_cast<std::size_t>(l * kFp8GemmSlots + static_cast<int>(g))] =
          std::make_unique<ops::Fp8Linear>(ctx, options, fp8_input_owner(g) == g);
}

ops::Fp8Linear& Fp8Layers::at(int layer, Fp8Gemm g) {
  LMSCALE_CHECK(layer >= first_ && layer < end_, "Fp8Layers: block {} is not one of [{}, {})", layer, first_, end_);
  auto& p = layers_[static_cast<std::size_t>((layer - first_) * kFp8GemmSlots + static_cast<int>(g))];
  LMSCALE_CHECK(p, "Fp8Layers: block {} has no FP8 layer {} (w1|w3 {})", layer, fp8_gemm_name(g),
                w13_grouped_ ? "grouped" : "separate");
  return *p;
}

const ops::Fp8Linear& Fp8Layers::at(int layer, Fp8Gemm g) const {
  return const_cast<Fp8Layers*>(this)->at(layer, g);
}

}  // namespace lmscale::model
