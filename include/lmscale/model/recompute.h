#pragma once
// Activation checkpointing (docs/architecture.md §4): which activations the forward keeps for the backward
// and which the backward recomputes. Results are bitwise those of `none` (the recompute runs the
// same ops on the same inputs); only memory and time change.
//   none       keep everything a block's backward reads.
//   every_k    keep only the input of each group of k consecutive blocks; the backward recomputes
//              the group's forward (keeping everything) just before the group's backward. k = 1
//              is "full" checkpointing: one [N,d] tensor per block.
//   selective  keep the outputs of the matmuls and of flash attention (costly to recompute),
//              recompute what is cheap per byte kept: the two RMSNorm outputs y1, y2 ([N,d] each,
//              from the kept input and rstd) and the SwiGLU product g ([N,F], elementwise), and
//              with naive attention the probabilities [B,H,T,T] (Megatron's choice: large, and one
//              scores product plus a softmax to rebuild). Per block it keeps 6d + 2F of the
//              8d + 3F values of `none` (xl: 30% less) for no recomputed matmul FLOPs with flash.
//   selective-mlp  also the FFN's inputs to the SwiGLU, a = w1 y2 and b = w3 y2 ([N,F] each):
//              keeps 6d per block (xl: 81% less than none) for two recomputed matmuls, half a
//              block's forward FLOPs.
//   keep_attention (every_k only): each block also keeps its attention output o [N,dl] and the
//              attention's log-sum-exp [B,H,T] (flash; naive: its probabilities [B,H,T,T]), and the
//              recompute skips the attention kernel: it rebuilds q, k, v (the backward reads them)
//              but not o. The attention is the costliest part of a block at long context (8b at 32k
//              tokens: ~40% of a block's forward FLOPs) and o is one [N,d] tensor, so this buys the
//              most recompute time per byte kept (FlashAttention's own argument for keeping the
//              log-sum-exp).
//   layers (every_k only, Megatron's "block" recompute method): only the first `layers` blocks
//              of each range of blocks the model holds (the whole model, a pipeline stage or an
//              interleaved chunk) are checkpointed; the blocks after them keep everything, as with
//              none, and the backward runs them without a recompute. 0: every block. Spends
//              spare memory on recomputing fewer blocks (8b at 32k: ~3.5 GiB more per block for
//              ~19 ms less recompute).
#include <string>

#include "lmscale/io/config.h"

namespace lmscale::model {

// What the forward keeps of one block for its backward (RecomputePolicy::block).
struct BlockKeep {
  // every_k: the block's activations are rebuilt by a recompute of its group before its backward;
  // the forward keeps none of them (but see attention).
  bool recomputed = false;
  // every_k: the block starts its group (or the held range): its input x is kept.
  bool group_input = false;
  // every_k with keep_attention: the attention output o and aux are kept; the recompute skips it.
  bool attention = false;
  // selective: the norms' outputs y1, y2 and the SwiGLU product g are rebuilt in the backward.
  bool drop_norms = false;
  // selective with naive attention: the probabilities [B,H,T,T] are rebuilt too.
  bool drop_probabilities = false;
  // selective-mlp: the FFN inputs a = w1 y2, b = w3 y2 are rebuilt too.
  bool drop_ffn_inputs = false;
};

struct RecomputePolicy {
  enum class Mode { none, every_k, selective };
  Mode mode = Mode::none;
  int k = 1;          // every_k: blocks per group
  bool mlp = false;   // selective: recompute the FFN's w1/w3 outputs too (selective-mlp)
  bool keep_attention = false;   // every_k: keep o and the attention's aux, skip it in the recompute
  int layers = 0;                // every_k: checkpoint only the first `layers` blocks of a range (0: all)

  // From the deck's train.activation_checkpointing / train.checkpoint_k /
  // train.checkpoint_keep_attention / train.checkpoint_layers.
  static RecomputePolicy from(Checkpointing kind, long long k, bool keep_attention = false,
                              long long layers = 0);
  // The same from the deck's [train] section (the trainer's and the memory replay's policy).
  static RecomputePolicy from(const TrainConfig& t);
  // The end of the checkpointed blocks of the range [l0, l1): l0 + layers, or l1.
  int checkpointed_end(int l0, int l1) const { return layers > 0 && l0 + layers < l1 ? l0 + layers : l1; }
  // What block l of the held range [l0, l1) keeps from a training forward; `flash`: the model's
  // attention saves only its log-sum-exp (nothing to drop).
  BlockKeep block(int l, int l0, int l1, bool flash) const;
  // every_k: the group of block l (groups are [g k, (g+1) k) in global layers, cut at l0).
  int group_of(int l) const { return mode == Mode::every_k ? l / k : l; }
};

}  // namespace lmscale::model
