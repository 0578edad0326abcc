#pragma once
// parallel.offload = optimizer for the strategies that keep the parameter store's flat buffers
// (one process, zero1, zero2; docs/parallel.md "CPU offload"): a range [begin, end) of the
// store's flat layout (the whole store, or a ZeRO shard) described for parallel::OffloadedShards.
//
//   units    the forward units' parts of the range, in forward order (0 the embedding, l+1 block
//            l, L+1 the final norm and the head; the flat layout holds each unit contiguously),
//            offsets from `begin`, one entry per unit (empty where the range has none of it)
//   targets  where each piece of the range lives on the device in the dtype the forward reads:
//            the working copy (flat_lowp, bf16/fp16) for matrices and embeddings, the store's fp32
//            weights (master_view: its whole master, or the packed master-read ranges of a store
//            that leaves the rest of the master to the offloaded optimizer) for the norm weights
//            and for every parameter without a working copy; adjacent pieces of one buffer merged
#include <cstdint>
#include <vector>

#include "lmscale/model/parameter_store.h"
#include "lmscale/parallel/offloaded_shards.h"

namespace lmscale::parallel {

// The forward unit of a parameter (layers: the model's block count).
int forward_unit(const model::ParamInfo& p, int layers);

std::vector<OffloadedShards::Range> store_units(const model::ParameterStore& store, int layers, std::int64_t begin,
                                                std::int64_t end);
std::vector<OffloadedShards::Target> store_targets(model::ParameterStore& store, std::int64_t begin, std::int64_t end);

}  // namespace lmscale::parallel
