#pragma once
// fsdp's FP8 weight gathers (parallel.fsdp_gather_dtype = fp8; docs/parallel.md, "FP8 weight
// gathers"): torchao's "float8 all-gather with precomputed dynamic scales", written for one fsdp
// unit whose sharded weights are all FP8 GEMM weights (a dense block's q, k, v, o, w1, w3, w2 under
// precision.mode = fp8 with current scaling). Per gather of the unit:
//   1. local_amax: each rank's amax of its piece of each of the unit's P weights (ops::amax over
//      the compute-dtype shard; 0 for a weight with no piece on this rank) into amax [P] fp32;
//   2. one all-reduce (max) of the P amaxes over the dp group, as int32: ops::amax's results are
//      |x| bits that order like the values with NaN the canonical quiet NaN above inf
//      (ops/fp8_scale_rule.h), so the integer max is exactly ops::amax of the whole weight, NaN
//      included, whatever the reduction order;
//   3. cast: per scale group the scale and inverse from the group's amax, the max of its members'
//      amaxes (ops::amax over them; ops::fp8_update_scale, current scaling's rule: a group whose
//      amax is 0, inf or NaN keeps its last scale, as ops::Fp8TensorScaling does), then each piece
//      cast to e4m3 with its group's scale (ops::cast_fp8) into the send buffer [s_u], which the
//      caller all-gathers, 1 byte per element.
// Scale groups are the weights one FP8 layer reads as one [sum R_i, K] matrix (a dense block's
// q|k|v and w1|w3, which the store holds back to back; model::fp8_weight_groups): members
// are consecutive weights of the unit, so their gathered bytes lie back to back and share one
// scale. The gathered group is then bitwise what ops::Fp8Linear's current scaling casts from the
// whole compute-dtype [sum R_i, K] (the same amax, scale and element-wise cast), and the FP8 GEMMs
// read it as it is (ops::Fp8Weight; model/transformer_fp8.cpp). A weight alone is a group of one.
#include <cstdint>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"
#include "lmscale/ops/fp8_linear.h"

namespace lmscale::parallel {

class FsdpFp8Scales {
 public:
  // A weight's piece in this rank's shard: elements [at, at + count) of the shard.
  struct Piece {
    int weight = 0;   // 0..P-1, the unit's weights in order
    std::int64_t at = 0, count = 0;
  };
  // Scales start at 1 (ops::Fp8TensorScaling's initial state); margin as precision.fp8_margin.
  // group_sizes: the unit's weights in order as scale groups of consecutive weights (sizes >= 1,
  // summing to the unit's P weights).
  FsdpFp8Scales(Context& ctx, const std::vector<int>& group_sizes, int margin);
  // Every weight its own scale group.
  FsdpFp8Scales(Context& ctx, int weights, int margin)
      : FsdpFp8Scales(ctx, std::vector<int>(weights > 0 ? weights : 0, 1), margin) {}

  // Steps 1-3 above: shard [s] (compute dtype) -> out [s] fp8_e4m3, scales of every weight set.
  // Elements of the shard outside every piece (the last rank's zero padding) are cast too, with
  // weight 0's scale (0 stays 0). Collective over dp: every rank calls it for the same unit.
  void cast_shard(Context& ctx, comm::Communicator& dp, const Tensor& shard, const std::vector<Piece>& pieces,
                  Tensor& out);
  // The steps apart (the unit test reduces the amaxes of simulated ranks itself):
  void local_amax(Context& ctx, const Tensor& shard, const std::vector<Piece>& pieces);
  Tensor& amax() { return amax_; }   // [P] fp32
  void cast(Context& ctx, const Tensor& shard, const std::vector<Piece>& pieces, Tensor& out);

  // Weight k as an FP8 GEMM operand: q its gathered e4m3 view [N,K], with its scale group's amax
  // and scales (the same tensors for every member of the group).
  ops::Fp8Weight weight(int k, const Tensor& q) const;
  int weights() const { return static_cast<int>(amax_.numel()); }
  int groups() const { return static_cast<int>(group_first_.size()); }
  int group_of(int k) const { return group_of_[static_cast<std::size_t>(k)]; }

 private:
  static constexpr std::int64_t kLine = 4;   // fp32 elements per 16-byte line (ops::linear_fp8's alignment)
  Tensor scale(int g) const { return scales_.flat_range((2 * g) * kLine, 1); }
  Tensor inv(int g) const { return scales_.flat_range((2 * g + 1) * kLine, 1); }
  // Group g's amax: its one member's entry of amax_, or its own element of group_amax_.
  Tensor group_amax(int g) const;
  int margin_ = 0;
  std::vector<int> group_of_;      // [P]: weight -> scale group
  std::vector<int> group_first_;   // [G]: the group's first weight
  std::vector<int> group_size_;    // [G]
  Tensor amax_;         // [P] fp32, the dp group's amax of each weight after cast_shard
  Tensor group_amax_;   // [G] fp32, the max of each group's members' amaxes (groups of one: unused)
  Tensor scales_;       // [2 G kLine] fp32: group g's scale at 2g kLine, its inverse at (2g + 1) kLine
};

}  // namespace lmscale::parallel
