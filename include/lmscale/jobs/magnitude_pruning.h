#pragma once
// Global magnitude pruning on the full flat fp32 parameters (model::parameter_layout order), the
// math of run.job = prune (jobs/prune.h, docs/recipes.md "Pruning"):
// - unstructured (L1): the weights of every attention projection (q, k, v, output) and FFN matrix
//   (w1, w2, w3) of every block compete under one global threshold on |w|; the embedding, the LM
//   head and the norm weights are never pruned (the embedding is a lookup table, not a matmul; the
//   head and the norms are small and the loss is most sensitive to them).
// - structured (L2): FFN hidden unit j of a block is row j of w1 and w3 and column j of w2 [d, F];
//   units are ranked within each block by sqrt(|w1[j,:]|^2 + |w3[j,:]|^2 + |w2[:,j]|^2) and the
//   same number is removed from every block, because the model has one d_ff for all blocks.
// Masks hold 1 (kept) or 0 (pruned) per element of the full layout; a kept set only shrinks.
#include <cstdint>
#include <vector>

#include "lmscale/model/model_dims.h"
#include "lmscale/model/parameter_store.h"

namespace lmscale::jobs {

// Kept fraction of the pruned set after `round` rounds of gamma = 1 - (1/10)^(1/theta), never
// below 1 - target_sparsity: max(0.1^(round/theta), 1 - target).
double kept_fraction(std::int64_t round, std::int64_t theta, double target_sparsity);
// Rounds of the fixed schedule: the first round whose kept fraction reaches 1 - target.
std::int64_t fixed_rounds(std::int64_t theta, double target_sparsity);

// Element ranges [offset, offset + numel) of the parameters unstructured pruning competes over.
std::vector<model::ParamInfo> prunable_parameters(const model::ModelDims& dims);
// Elements of the prunable set (sum of numel).
std::int64_t prunable_count(const model::ModelDims& dims);

// A mask of ones over the full layout.
std::vector<std::uint8_t> full_mask(const model::ModelDims& dims);
// Removes the kept prunable elements with the smallest |w| until `keep` remain (ties: lower
// index first, so exactly that many remain). `keep` must not exceed the kept count now.
void prune_unstructured(const model::ModelDims& dims, const std::vector<float>& w, std::vector<std::uint8_t>& mask,
                        std::int64_t keep);

// Per block, kept[layer][unit] (1 = kept) of the FFN's d_ff units.
using UnitMask = std::vector<std::vector<std::uint8_t>>;
UnitMask full_unit_mask(const model::ModelDims& dims);
std::int64_t kept_units(const UnitMask& units);   // per block (the same in every block)
// Removes the kept units with the smallest L2 norm in each block until `keep` remain per block.
void prune_units(const model::ModelDims& dims, const std::vector<float>& w, UnitMask& units, std::int64_t keep);
// The element mask of a unit mask: rows of w1, w3 and columns of w2 of removed units are 0.
std::vector<std::uint8_t> unit_element_mask(const model::ModelDims& dims, const UnitMask& units);

// w[i] = 0 where mask[i] == 0.
void apply_mask(std::vector<float>& w, const std::vector<std::uint8_t>& mask);
// Zeros among the prunable elements of w.
std::int64_t prunable_zeros(const model::ModelDims& dims, const std::vector<float>& w);

// The parameters of the smaller model (dims with d_ff = kept units per block) in its full layout:
// every parameter copied, w1/w3 without the removed rows and w2 without the removed columns.
std::vector<float> compact_units(const model::ModelDims& dims, const std::vector<float>& w, const UnitMask& units);

}  // namespace lmscale::jobs
