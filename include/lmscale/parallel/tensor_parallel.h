#pragma once
// Tensor parallelism (Megatron-LM, docs/architecture.md §4) over the tp group of the dp x tp x pp mesh: the
// collectives the model's f/g points call (model/tensor_parallel.h), and the bookkeeping of a
// layout in which each rank holds slices of the parameters:
//   - the global gradient norm counts the replicated norm weights once (they are identical on the
//     tp ranks), the sliced parameters' squares summed over the tp ranks;
//   - full parameters by name (train.save, checkpoints) are assembled from the ranks' slices, and
//     a full parameter set (a weights file of any layout) is sliced back.
// Activations travel in the compute dtype over the device communicator (NCCL on GPUs: queued on
// its stream, the compute stream waits on the device, the host does not block); parameters for
// files over the host (MPI) communicator in fp32.
#include <cstdint>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/core/context.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/tensor_parallel.h"

namespace lmscale::parallel {

class TensorParallel {
 public:
  // device: the tp group's communicator for activations; host: an mpi communicator of the same
  // ranks in the same order, for host scalars and parameter files.
  TensorParallel(comm::Communicator& device, comm::Communicator& host, bool sequence_parallel);

  // The static part for the parameter store and the model.
  model::TensorSplit split() const { return split_; }
  // The callbacks for ParallelContext::tp.
  const model::TensorParallelComm& callbacks() const { return callbacks_; }
  int degree() const { return split_.degree; }

  // Sum of a host scalar over the tp ranks.
  double sum_scalar(double x);
  // Sum of squares of the full model's gradient from this rank's: sliced = this rank's sum of
  // squares over all its gradients (already summed over data-parallel ranks), replicated = the
  // part of it that belongs to the replicated parameters (the norm weights).
  double global_sum_squares(double local_all, double local_replicated);
  // Per-parameter partial sums (optim::Optimizer::kNormSlots per parameter of the store, whose
  // infos give split_dim) summed over the tp ranks: a sliced parameter's pieces add up to the
  // whole parameter; a replicated one (split_dim < 0) is counted once (tp rank 0's values).
  void sum_param_norms(const std::vector<model::ParamInfo>& infos, int slots, std::vector<double>& sums);

  // This rank's flat fp32 buffer (host) in its store's layout `infos` -> the same parameters
  // whole (full_shape), one after the other in store order, on every tp rank (collective). For a
  // store of the whole model that is model::parameter_layout(dims) (order and offsets); for a
  // pipeline stage (tp x pp) the stage's parameters. Every tp rank's store has the same infos
  // but for split_begin.
  std::vector<float> gather_full(const std::vector<model::ParamInfo>& infos, const std::vector<float>& local);
  // The inverse: this rank's slices out of those whole parameters (no communication).
  std::vector<float> slice_local(const std::vector<model::ParamInfo>& infos, const std::vector<float>& whole) const;

 private:
  comm::Communicator& device_;
  comm::Communicator& host_;
  model::TensorSplit split_;
  model::TensorParallelComm callbacks_;
};

}  // namespace lmscale::parallel
