#pragma once
// The map between this rank's store and the full model's flat layout
// (model::parameter_layout(dims), docs/architecture.md §2), for weights files, checkpoints and
// tests: a rank's store holds its tensor-parallel slices (parallel/tensor_parallel.h) of its
// pipeline stage's chunks (model/stage.h), in chunk order.
#include <cstdint>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/stage.h"

namespace lmscale::parallel {

class TensorParallel;
class ExpertParallel;

class FullLayout {
 public:
  // tp: null without tensor parallelism. host_pp: the host communicator of the pp group, null
  // without a pipeline; chunks_of(stage) lists each stage's chunks as the mesh assigned them.
  // ep: null without expert parallelism (the ep ranks' expert rows are gathered like tp slices;
  // not combined with tp or pp).
  FullLayout(const model::ModelDims& dims, const model::ParameterStore& store, TensorParallel* tp,
             comm::Communicator* host_pp, int virtual_stages, std::vector<std::int64_t> stage_layers,
             ExpertParallel* ep = nullptr);

  // A buffer in this rank's store layout (parameters, optimizer moments) -> the full layout on
  // every rank (collective under tp and pp: gathered over tp, then over pp).
  std::vector<float> to_full(const std::vector<float>& local) const;
  // The inverse: this rank's part of a full-layout buffer (no communication).
  std::vector<float> to_local(const std::vector<float>& full) const;

 private:
  model::ModelDims dims_;
  const model::ParameterStore& store_;
  TensorParallel* tp_;
  ExpertParallel* ep_;
  comm::Communicator* host_pp_;
  int virtual_stages_;
  std::vector<std::int64_t> stage_layers_;
};

}  // namespace lmscale::parallel
