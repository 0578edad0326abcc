#pragma once
// Tensor parallelism as the model sees it (Megatron-LM, Shoeybi et al. 2019; sequence parallelism,
// Korthikanti et al. 2022). Two parts, neither of which knows about communicators:
//
// 1. TensorSplit, static: the degree tp, this rank's index, whether sequence parallelism is on.
//    The parameter store derives every parameter's local slice from it (tensor_parallel_layout):
//      q/k/v_proj [d, d]      rows    (column-parallel: heads [r H/tp, (r+1) H/tp))     -> [d/tp, d]
//      output_proj [d, d]     columns (row-parallel: the same heads' inputs)             -> [d, d/tp]
//      w1, w3 [F, d]          rows    (column-parallel)                                  -> [F/tp, d]
//      w2 [d, F]              columns (row-parallel)                                     -> [d, F/tp]
//      token_embeddings,      rows    (vocabulary-parallel: ids [r V/tp, (r+1) V/tp))    -> [V/tp, d]
//      lm_head [V, d]
//      ln1, ln2, ln_final [d] whole (replicated on every tp rank)
//    Names stay the full parameters' names; ParamInfo::full_shape/split_dim/split_begin say where
//    the slice sits, so initial values (a function of (seed, name, full element index)) and
//    weights files (full parameters by name) are independent of the layout.
//
// 2. TensorParallelComm, callbacks over the tp group (set by parallel/tensor_parallel.cpp into
//    ParallelContext::tp). The model builds Megatron's conjugate operators from them:
//      f  (before a column-parallel matmul): forward identity,  backward all-reduce (sum)
//      g  (after a row-parallel matmul):     forward all-reduce, backward identity
//    and with sequence parallelism, where norms and residual adds run on row shards [N/tp, d]:
//      f' : forward all-gather of rows,  backward reduce-scatter of rows
//      g' : forward reduce-scatter,      backward all-gather
//    All of them take activations in the compute dtype; `max`/`sum` also take fp32 statistics
//    (vocab-parallel cross-entropy, norm-weight gradients under sequence parallelism).
//    On GPUs the collectives are queued on the communicator's stream and the compute stream waits
//    for them on the device: the host never blocks.
#include <cstdint>
#include <functional>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"
#include "lmscale/model/model_dims.h"

namespace lmscale::model {

struct ParamInfo;

struct TensorSplit {
  int degree = 1;                  // tp
  int rank = 0;                    // index in the tp group, 0 .. degree-1
  bool sequence_parallel = false;  // norms and residuals on row shards (only with degree > 1)

  bool active() const { return degree > 1; }
  bool sequence_sharded() const { return degree > 1 && sequence_parallel; }
  // Local extents of a dimension split in `degree` equal parts (divisibility checked by the deck).
  std::int64_t local(std::int64_t full) const { return full / degree; }
  std::int64_t begin(std::int64_t full) const { return rank * (full / degree); }
};

struct TensorParallelComm {
  // In place over the tp group: x = sum (or max) of every rank's x. Any float dtype.
  std::function<void(Tensor& x)> sum, max;
  // Rows: full [R*tp, ...] = the ranks' shards [R, ...] in rank order (all-gather).
  std::function<void(const Tensor& shard, Tensor& full)> gather_rows;
  // Rows: shard [R, ...] = rows [rank R, (rank+1) R) of the sum over ranks of full [R*tp, ...].
  std::function<void(const Tensor& full, Tensor& shard)> scatter_rows;
  // Asynchronous sum and scatter_rows: start the collective and return the function that makes
  // its result usable (nccl: the compute stream waits for it; mpi: the host waits). The model
  // computes the weight gradients in between (f backward overlapped with the dW GEMMs). Empty:
  // the synchronous forms are used.
  using Wait = std::function<void()>;
  std::function<Wait(Tensor& x)> sum_async;
  std::function<Wait(const Tensor& full, Tensor& shard)> scatter_rows_async;
};

// The local layout of the parameters (names, local shapes, offsets in the local flat buffer, and
// where each slice sits in its full parameter). degree 1: parameter_layout(dims), unchanged.
std::vector<ParamInfo> tensor_parallel_layout(const ModelDims& dims, const TensorSplit& split);

// The layout with the stacked expert tensors of the MoE blocks (ffn.experts.*) cut to this ep
// rank's experts: rows [rank E/ep, (rank+1) E/ep) of the leading axis (split_dim 0), offsets
// renumbered. degree 1: `layout` unchanged. Not combined with a tensor-parallel split (the deck
// refuses tp with MoE). (model/expert_parallel.cpp)
struct ExpertSplit;
std::vector<ParamInfo> expert_parallel_layout(std::vector<ParamInfo> layout, const ModelDims& dims,
                                              const ExpertSplit& experts);
// Whether p is a stacked expert tensor [E, ...] of an MoE block.
bool is_expert_parameter(const ParamInfo& p);

// Copies a parameter's local slice between the full parameter (row-major, full_shape) and the
// slice (row-major, local shape), in elements of `elem_bytes` bytes: to_full = true writes the
// slice into `full`, false reads it out of `full`.
void copy_slice(const ParamInfo& local, void* full, void* slice, std::size_t elem_bytes, bool to_full);

// Initial values of a parameter's local slice (dst: its numel, any device and float dtype): the
// full parameter's values (initial_values, by full element index) at the slice's positions.
void fill_slice_initial_values(const ParamInfo& local, std::uint64_t seed, Tensor dst, Context& ctx);
// The same for elements [begin, end) of the slice in its local row-major order (dst: end - begin
// elements): FSDP over a tensor-parallel slice holds a range of it, which for a row-parallel
// slice may start and end inside a row.
void fill_slice_initial_values(const ParamInfo& local, std::uint64_t seed, std::int64_t begin, std::int64_t end,
                               Tensor dst, Context& ctx);

}  // namespace lmscale::model
