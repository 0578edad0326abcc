#pragma once
// What an MoE block keeps between its forward and its backward, and the routing statistics the
// model gathers per MoE block (docs/moe.md). Shapes: N token rows of this rank, E experts, k =
// top-k, M kept assignments of this rank's tokens, Me rows its own experts compute (M in one
// process; under expert parallelism the rows received from the ep group), d = d_model, Fe =
// expert d_ff. The SwiGLU activations a, b, g [Me,Fe] live in BlockActivations.
#include <cstdint>
#include <vector>

#include "lmscale/core/tensor.h"

namespace lmscale::model {

struct MoeActivations {
  Tensor probs, lse;            // router softmax [N,E] and its logsumexp [N]
  Tensor experts, gates, slot;  // [N,k]: chosen experts (int32), renormalised gates, row in xe (-1 dropped)
  std::vector<std::int64_t> kept;     // [E] kept assignments per expert of this rank's tokens
  std::vector<std::int64_t> routed;   // [E] the same before the capacity
  Tensor xe;                    // [Me,d] expert inputs, expert-major (this rank's experts)
  std::vector<std::int64_t> expert_rows;   // [E/ep] rows of xe per local expert
  Tensor ye;                    // [M,d] expert outputs back in the token side's order (combine)
  // Expert parallelism: rows sent to / received from each ep rank, and the permutation between
  // the received order (source rank, then local expert) and expert-major xe: perm[i, 0] = the row
  // of xe that received row i becomes.
  std::vector<std::int64_t> send_rows, recv_rows;
  Tensor perm;                  // [Me,1] int32
};

// Routing counts of one MoE block summed over the training forwards since the last reset.
struct MoeLayerStats {
  int layer = -1;
  std::vector<std::int64_t> routed;   // [E] assignments chosen per expert (before the capacity)
  std::vector<std::int64_t> kept;     // [E] assignments computed (after the capacity)
  double balance_sum = 0;             // sum of ops::moe_router_losses terms[0]
  double z_sum = 0;                   // sum of terms[1]
  std::int64_t tokens = 0;            // token rows routed
};

}  // namespace lmscale::model
