#pragma once
// The interleaved 1F1B schedule (Megatron-LM's forward_backward_pipelining_with_interleaving,
// Narayanan et al. 2021) as a plan: the ordered list of what one pipeline rank does in one step,
// computed from (p, V, M, stage) alone. parallel/pipeline.cpp executes it; ctest/unit checks it
// without MPI for every small (p, V, M): each message reaches the virtual stage that needs it,
// and posting each communication point as one grouped exchange (Communicator::exchange, NCCL's
// matching by order included) cannot deadlock.
//
// Numbering: rank s of p holds chunks c = 0..V-1, virtual stage c*p + s. The rank's M*V
// chunk-microbatches k = 0..M*V-1 run in groups of p consecutive k on one chunk:
//   forward chunk  (k mod pV) / p,   backward chunk V - 1 - (k mod pV) / p,
//   microbatch     (k / pV) * p + k mod p.
// Activations go forward around the ring (virtual stage v on rank s feeds v + 1 on rank
// (s + 1) mod p: rank p-1's chunk c feeds rank 0's chunk c + 1), gradients backward.
#include <vector>

namespace lmscale::parallel {

struct InterleavedStep {
  enum class Kind { forward, backward, exchange };
  Kind kind = Kind::exchange;
  // forward / backward: the chunk-microbatch. Its input (activation, or the gradient of its
  // output) is the oldest tensor received for its chunk, except on virtual stage 0 (tokens) and
  // the last virtual stage (the loss) which receive none.
  int k = -1;
  // exchange (one communication point, posted as one grouped operation):
  int send_output_of = -1;   // forward k whose output goes to the next rank (-1: nothing)
  int send_grad_of = -1;     // backward k whose input gradient goes to the previous rank (-1: nothing)
  int recv_input_chunk = -1; // an activation arrives from the previous rank for this chunk (-1: none)
  int recv_grad_chunk = -1;  // a gradient arrives from the next rank for this chunk (-1: none)
};

int interleaved_forward_chunk(int k, int stages, int virtual_stages);
int interleaved_backward_chunk(int k, int stages, int virtual_stages);
int interleaved_microbatch(int k, int stages, int virtual_stages);

// The plan of rank `stage` of `stages` with `virtual_stages` chunks each over `microbatches`
// (a multiple of stages): warm-up forwards, the steady one-forward-one-backward phase, the
// cool-down backwards, each step followed by its communication point as Megatron places them.
std::vector<InterleavedStep> interleaved_plan(int stages, int virtual_stages, int microbatches, int stage);

}  // namespace lmscale::parallel
