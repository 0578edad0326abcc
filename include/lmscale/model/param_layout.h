#pragma once
// Where each parameter sits in the flat parameter list (model::parameter_layout; docs/architecture.md
// §2), by name instead of by arithmetic:
//   0                        token_embeddings.weight
//   per dense block l:       q, k, v, o (attn.{q,k,v,output}_proj), ln1, w1, w3, w2 (ffn), ln2
//   per MoE block l:         q, k, v, o, ln1, router (ffn.router), w1, w3, w2 (ffn.experts.*:
//                            all experts stacked [E, ...]), ln2            (docs/moe.md)
//   then                     ln_final.weight, lm_head.weight
// The reference model's named_parameters() order except that w3 comes before w2: w1 and w3 (same
// shape, both read y2) lie back to back like q, k, v, so each pair is one GEMM each way
// (ops::linear_side_by_side). Names are unchanged and files are read by name.
// Units (model/parallel_context.h): 0 = the embedding, 1..L = blocks 0..L-1, L+1 = the head.
// Every index computation of the model, the pipeline stages and the predictors goes through
// ParamIndex; a unit test holds it against parameter_layout's names.
#include <array>

#include "lmscale/model/model_dims.h"

namespace lmscale::model {

// Full-model parameter indices of one block. router = -1 in a dense block.
struct BlockParams {
  int q, k, v, o, ln1, w1, w3, w2, ln2;   // layout order
  int router = -1;
  // The nine shared by dense and MoE blocks, in layout order (q first, w1 then w3 then w2, ln2 last).
  std::array<int, 9> all() const { return {q, k, v, o, ln1, w1, w3, w2, ln2}; }
};

class ParamIndex {
 public:
  static constexpr int kPerBlock = 9;      // a dense block's parameters
  static constexpr int kPerMoeBlock = 10;  // an MoE block's: the router besides
  // A dense model of `layers` blocks.
  explicit constexpr ParamIndex(int layers) : layers_(layers), moe_every_(0) {}
  // The model of `dims` (its MoE blocks, if any).
  explicit constexpr ParamIndex(const ModelDims& dims)
      : layers_(static_cast<int>(dims.layers)), moe_every_(dims.moe() ? static_cast<int>(dims.moe_every) : 0) {}

  constexpr int embedding() const { return 0; }
  constexpr bool is_moe(int l) const { return moe_every_ > 0 && l % moe_every_ == moe_every_ - 1; }
  constexpr BlockParams block(int l) const {
    const int b = first_of_block(l);
    // Dense: q k v o ln1 w1 w3 w2 ln2 at b..b+8; MoE: the router at b+5, the experts' w1 w3 w2 after it.
    if (!is_moe(l))
      return {.q = b, .k = b + 1, .v = b + 2, .o = b + 3, .ln1 = b + 4, .w1 = b + 5, .w3 = b + 6, .w2 = b + 7,
              .ln2 = b + 8, .router = -1};
    return {.q = b, .k = b + 1, .v = b + 2, .o = b + 3, .ln1 = b + 4, .w1 = b + 6, .w3 = b + 7, .w2 = b + 8,
            .ln2 = b + 9, .router = b + 5};
  }
  constexpr int ln_final() const { return first_of_block(layers_); }
  constexpr int lm_head() const { return ln_final() + 1; }
  constexpr int count() const { return lm_head() + 1; }

  // The first parameter of unit u (u = L + 2: count(), one past the head).
  constexpr int first_of_unit(int u) const { return u == 0 ? 0 : u <= layers_ + 1 ? first_of_block(u - 1) : count(); }
  // The unit that holds parameter p.
  constexpr int unit_of(int p) const {
    if (p == 0) return 0;
    if (p >= ln_final()) return layers_ + 1;
    int l = (p - 1) / kPerBlock;   // an upper bound: MoE blocks hold more
    while (first_of_block(l) > p) --l;
    return 1 + l;
  }
  // Whether p is a norm weight (ln1, ln2, ln_final): replicated, not sharded by FSDP.
  constexpr bool is_norm(int p) const {
    if (p == ln_final()) return true;
    if (p <= 0 || p > ln_final()) return false;
    const BlockParams b = block(unit_of(p) - 1);
    return p == b.ln1 || p == b.ln2;
  }
  // Whether p and p + 1 run one GEMM side by side (q|k|v: q and k; a dense block's w1|w3: w1), so
  // their gradients must stay back to back (ParamInfo::joins_next, parallel/grad_buckets.h).
  constexpr bool joins_next(int p) const {
    if (p <= 0 || p >= ln_final()) return false;
    const int l = unit_of(p) - 1;
    const BlockParams b = block(l);
    return p == b.q || p == b.k || (!is_moe(l) && p == b.w1);
  }

 private:
  // Index of block l's first parameter (l = L: ln_final).
  constexpr int first_of_block(int l) const { return 1 + l * kPerBlock + (moe_every_ > 0 ? l / moe_every_ : 0); }

  int layers_;
  int moe_every_;   // 0: dense
};

}  // namespace lmscale::model
