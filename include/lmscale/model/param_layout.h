#pragma once
// Where each parameter sits in the flat parameter list (model::parameter_layout, the reference
// model's named_parameters() order; docs/architecture.md §2), by name instead of by arithmetic:
//   0                        token_embeddings.weight
//   per block l: q, k, v, o (attn.{q,k,v,output}_proj), ln1, w1, w2, w3 (ffn), ln2
//   then                     ln_final.weight, lm_head.weight
// Units (model/parallel_context.h): 0 = the embedding, 1..L = blocks 0..L-1, L+1 = the head.
// Every index computation of the model, the pipeline stages and the predictors goes through
// ParamIndex; a unit test holds it against parameter_layout's names.
#include <array>

namespace lmscale::model {

// Full-model parameter indices of one block.
struct BlockParams {
  int q, k, v, o, ln1, w1, w2, w3, ln2;
  // All nine, in layout order (q first, ln2 last).
  std::array<int, 9> all() const { return {q, k, v, o, ln1, w1, w2, w3, ln2}; }
};

class ParamIndex {
 public:
  static constexpr int kPerBlock = 9;   // BlockParams' members
  explicit constexpr ParamIndex(int layers) : layers_(layers) {}

  constexpr int embedding() const { return 0; }
  constexpr BlockParams block(int l) const {
    const int b = 1 + l * kPerBlock;
    return {b, b + 1, b + 2, b + 3, b + 4, b + 5, b + 6, b + 7, b + 8};
  }
  constexpr int ln_final() const { return 1 + layers_ * kPerBlock; }
  constexpr int lm_head() const { return ln_final() + 1; }
  constexpr int count() const { return lm_head() + 1; }

  // The first parameter of unit u (u = L + 2: count(), one past the head).
  constexpr int first_of_unit(int u) const { return u == 0 ? 0 : u <= layers_ + 1 ? 1 + (u - 1) * kPerBlock : count(); }
  // The unit that holds parameter p.
  constexpr int unit_of(int p) const { return p == 0 ? 0 : p >= ln_final() ? layers_ + 1 : 1 + (p - 1) / kPerBlock; }
  // Whether p is a norm weight (ln1, ln2, ln_final): replicated, not sharded by FSDP.
  constexpr bool is_norm(int p) const {
    return p == ln_final() || (p > 0 && p < ln_final() && ((p - 1) % kPerBlock == 4 || (p - 1) % kPerBlock == 8));
  }

 private:
  int layers_;
};

}  // namespace lmscale::model
