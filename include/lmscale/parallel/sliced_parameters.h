#pragma once
// Full parameters from the slices a group of ranks holds, and back (train.save, whole-file
// checkpoints). Shared by tensor parallelism (each tp rank a slice of the split matrices) and
// expert parallelism (each ep rank the rows of its experts in every stacked expert tensor): in
// both, every rank of the group has the same store layout but for split_begin, the slice of rank
// q starting at q x the local extent of split_dim; parameters without split_dim are identical on
// all ranks of the group.
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/model/parameter_store.h"

namespace lmscale::parallel {

// This rank's flat fp32 buffer (host) in its store's layout `infos` -> the same parameters whole
// (full_shape), one after the other in store order, on every rank of `host` (collective, the
// group's host communicator).
std::vector<float> gather_sliced(comm::Communicator& host, const std::vector<model::ParamInfo>& infos,
                                 const std::vector<float>& local);
// The inverse: this rank's slices out of those whole parameters (no communication).
std::vector<float> slice_whole(const std::vector<model::ParamInfo>& infos, const std::vector<float>& whole);

}  // namespace lmscale::parallel
