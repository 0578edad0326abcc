#pragma once
// Communication of tensor (and sequence) parallelism per step, and the analysis of the CS336
// handout §8: for a model and batch, a device FLOP rate C and a per-GPU link bandwidth W, the
// degree at which data-, fully-sharded-, tensor- and 2D (FSDP x TP) parallelism become
// communication bound, i.e. the smallest degree n at which the bytes a rank moves per step take at
// least as long at W as its share of the step's FLOPs takes at C. Volumes are lmscale's own (what
// the strategies in parallel/ send, ring algorithms: an all-reduce moves 2(n-1)/n of the buffer per
// rank, a reduce-scatter or all-gather (n-1)/n), so the analysis describes this code, not an
// idealised one.
#include <cstdint>
#include <string>
#include <vector>

#include "lmscale/io/config.h"
#include "lmscale/model/model_dims.h"

namespace lmscale::jobs {

struct TensorParallelComm {
  double bytes = 0;             // per rank per step
  int all_reduces = 0, all_gathers = 0, reduce_scatters = 0;   // of activations [tokens, d]
  std::string formula;
};

// The activation collectives of one step of `tokens` tokens (the tp group's share of the global
// batch) at tensor-parallel degree tp: without sequence parallelism 4L + 2 all-reduces of
// [tokens, d] (g forward and f backward of each sublayer, the embedding's g and the head's f), with
// it 6L + 3 all-gathers and 4L + 2 reduce-scatters (the backward gathers the norms' outputs again
// for the weight gradients, as Megatron does) plus 2L + 1 all-reduces of norm-weight gradients [d];
// full recomputation (every-k) repeats the blocks' forward collectives. Plus the vocabulary-parallel
// cross-entropy's statistics (fp32 max [tokens] and sums [tokens, 2]). e = activation bytes.
TensorParallelComm tensor_parallel_comm(const model::ModelDims& m, double tokens, int tp, bool sequence_parallel,
                                        double e, bool recompute_forward);

struct ParallelBound {
  std::string strategy;      // data, fsdp, tensor, tensor+sp, 2d (fsdp x tensor), expert (MoE models)
  std::int64_t degree = 0;   // smallest communication-bound degree; 0 = none up to the limit scanned
  std::int64_t limit = 0;    // the largest degree scanned (tensor: the head count; expert: the experts)
  std::string split;         // 2d: the best fsdp x tp split at `degree`
  std::string formula;       // per-rank bytes per step as a function of n
};

// The analysis for the global batch of `cfg` (bench.batch_size for bench-model, else
// train.batch_size, times context_length tokens), flops_per_s = C, link_bytes_per_s = W.
std::vector<ParallelBound> parallel_bounds(const Config& cfg, double flops_per_s, double link_bytes_per_s);

}  // namespace lmscale::jobs
