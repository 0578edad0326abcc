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
};

}  // namespace lmscale::model
