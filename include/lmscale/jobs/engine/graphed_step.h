#pragma once
// The train step captured as a CUDA graph (train.cuda_graphs; docs/architecture.md §5, "The
// captured step"): what one capture holds so its replays can run it again. Trainer::train_step
// runs a shape's first step eagerly (warming the allocator's cache, the cuBLASLt plans and the
// one-time tables), captures the second and replays it from then on (jobs/engine/graphed_step.cpp).
#include <cstdint>
#include <memory>
#include <vector>

#include "lmscale/core/tensor.h"
#include "lmscale/ops/cuda_graph.h"
#include "lmscale/parallel/schedule.h"

namespace lmscale::jobs {

struct GraphedStep {
  // What the capture baked in: the sequence length (every shape) and the loss scale (the loss
  // gradient's seed scale / (B T) and the 1 / scale of the clip are captured kernel arguments).
  // Another T or scale is another capture.
  std::int64_t T = 0;
  double loss_scale = 1;
  // Fixed device input buffers, one micro-batch each (int32 [rows, T] inputs and targets): the
  // host copies each step's tokens into them before the replay. Outside the graph's pool.
  std::vector<parallel::MicroBatch> inputs;
  // f64 [ops::kClipSlots]: the gradient norm, the clipped gradient scale and the finite flag the
  // replay writes (ops::clip_grad_scale); outside the pool.
  Tensor clip;
  // The micro-batches' loss sums the replay writes (device scalars in the graph's pool, held
  // here so their blocks stay the graph's).
  std::vector<Tensor> loss_sums;
  std::unique_ptr<ops::CudaGraph> graph;   // destroyed first: it waits for a replay in flight
};

// A shape's state under train.cuda_graphs: the key of the last eager step (the next step of the
// same key is captured), and counts for the results file.
struct GraphStats {
  std::int64_t captures = 0;     // graphs captured so far (one per shape and loss scale)
  std::int64_t replays = 0;      // steps run as a replay
  std::int64_t eager_steps = 0;  // steps run eagerly under train.cuda_graphs (a shape's first)
  std::size_t nodes = 0;         // nodes of the current graph
  std::size_t pool_bytes = 0;    // bytes of the current graph's allocator pool
};

}  // namespace lmscale::jobs
