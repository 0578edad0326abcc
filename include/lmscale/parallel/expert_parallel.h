#pragma once
// Expert parallelism over the ep group of the mesh (docs/parallel.md, "Expert parallelism";
// model/expert_parallel.h for the model's side): the E experts of every MoE block are split over
// the ep consecutive ranks of each data-parallel group, rank i of the group holding experts
// [i E/ep, (i+1) E/ep). This class owns what the group does:
//   - the all-to-alls of the MoE blocks' dispatch and combine (ParallelContext::ep): the counts
//     over the host communicator (the host sizes the buffers from them), the rows over the device
//     communicator in the compute dtype, or over the GPUs' copy engines (parallel.ep_exchange =
//     copy-engine: parallel/copy_engine_all_to_all.h);
//   - the sum over the group of the dense parameters' gradients (each ep rank's tokens are its
//     own, so the dense gradient is the sum over all dp ranks = over ep, then over expert_dp);
//   - the gradient norm (expert parameters are different on each ep rank: their squares add over
//     the group; the dense ones are identical on its ranks after that sum: counted once);
//   - full parameters for files: the ep ranks' expert rows gathered (parallel/sliced_parameters.h).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/model/expert_parallel.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/ops/runtime.h"
#include "lmscale/parallel/copy_engine_all_to_all.h"

namespace lmscale::parallel {

class ExpertParallel {
 public:
  // device: the ep group for activations (the model's device); host: the same ranks, in the same
  // order, on the host (mpi) communicator.
  ExpertParallel(comm::Communicator& device, comm::Communicator& host);
  // The callbacks hold this object's address.
  ExpertParallel(const ExpertParallel&) = delete;
  ExpertParallel& operator=(const ExpertParallel&) = delete;
  // parallel.ep_exchange = copy-engine: from now on the rows go over the copy engines through a
  // receive window of slot_bytes per other rank (CopyEngineAllToAll::slot_bytes), allocated here.
  // Collective over the group. Throws UsageError naming parallel.ep_exchange unless the device
  // communicator is NCCL's (CUDA) and the ranks' GPUs share a node with peer access.
  void use_copy_engine(ops::Runtime& rt, std::size_t slot_bytes);

  model::ExpertSplit split() const { return split_; }
  const model::ExpertParallelComm& callbacks() const { return callbacks_; }
  int degree() const { return split_.degree; }
  int rank() const { return split_.rank; }

  // Whether parameter p of a store is an expert tensor (held in slices over the group).
  static bool holds_slice(const model::ParamInfo& p);
  // g (a dense parameter's gradient, on the model's device) summed over the group, in place. The
  // returned Work is already waited on unless async (then g must stay untouched until it is).
  comm::Work sum_gradient(Tensor& g, bool async);
  // Several dense gradients summed over the group as one operation (one NCCL group: one launch
  // and one host-side wait instead of one per gradient); asynchronous, as sum_gradient(g, true).
  comm::Work sum_gradients(const std::vector<Tensor>& grads);
  // Whether sum_gradient may run asynchronously: on the nccl backend (ordered on its own stream).
  bool async_sums() const { return device_.backend() == comm::Backend::nccl; }
  // Sum of a host scalar over the group.
  double sum_scalar(double x);
  // The global sum of squares from this rank's: all = over every gradient it holds (each already
  // global over expert_dp), experts = the part of it in expert tensors.
  double global_sum_squares(double all, double experts);
  // Whole parameters from the group's slices (collective) and back (no communication).
  std::vector<float> gather_full(const std::vector<model::ParamInfo>& infos, const std::vector<float>& local);
  std::vector<float> slice_local(const std::vector<model::ParamInfo>& infos, const std::vector<float>& whole) const;

 private:
  comm::Communicator& device_;
  comm::Communicator& host_;
  model::ExpertSplit split_;
  model::ExpertParallelComm callbacks_;
  std::unique_ptr<CopyEngineAllToAll> copy_engine_;   // parallel.ep_exchange = copy-engine
};

}  // namespace lmscale::parallel
