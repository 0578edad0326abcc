// FsdpFp8Scales (lmscale/parallel/fsdp_fp8_gather.h): the amax, its reduction over dp and the cast
// of one fsdp unit's shard into the e4m3 bytes its all-gather moves.
#include "lmscale/parallel/fsdp_fp8_gather.h"

#include <algorithm>

#include "lmscale/core/error.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/ops.h"

namespace lmscale::parallel {

FsdpFp8Scales::FsdpFp8Scales(Context& ctx, const std::vector<int>& group_sizes, int margin) : margin_(margin) {
  LMSCALE_CHECK(!group_sizes.empty() && margin >= 0, "FsdpFp8Scales: {} scale groups, margin {}", group_sizes.size(),
                margin);
  for (int n : group_sizes) {
    LMSCALE_CHECK(n >= 1, "FsdpFp8Scales: a scale group of {} weights", n);
    group_first_.push_back(static_cast<int>(group_of_.size()));
    group_size_.push_back(n);
    group_of_.insert(group_of_.end(), static_cast<std::size_t>(n), static_cast<int>(group_first_.size()) - 1);
  }
  const auto P = static_cast<std::int64_t>(group_of_.size()), G = static_cast<std::int64_t>(group_first_.size());
  amax_ = Tensor::empty({P}, DType::f32, *ctx.allocator, "fp8_amax_history");
  group_amax_ = Tensor::empty({G}, DType::f32, *ctx.allocator, "fp8_amax_history");
  scales_ = Tensor::empty({2 * G * kLine}, DType::f32, *ctx.allocator, "fp8_scale");
  ops::fill(ctx, amax_, 0.0);
  ops::fill(ctx, group_amax_, 0.0);
  ops::fill(ctx, scales_, 1.0);
}

Tensor FsdpFp8Scales::group_amax(int g) const {
  const auto gi = static_cast<std::size_t>(g);
  return group_size_[gi] == 1 ? amax_.flat_range(group_first_[gi], 1) : group_amax_.flat_range(g, 1);
}

void FsdpFp8Scales::local_amax(Context& ctx, const Tensor& shard, const std::vector<Piece>& pieces) {
  ops::fill(ctx, amax_, 0.0);   // a weight with no piece here: 0, the identity of the max
  for (const Piece& p : pieces) {
    LMSCALE_CHECK(p.weight >= 0 && p.weight < weights() && p.at >= 0 && p.at + p.count <= shard.numel(),
                  "FsdpFp8Scales: piece of weight {} at [{}, {}) outside the shard of {}", p.weight, p.at,
                  p.at + p.count, shard.numel());
    Tensor out = amax_.flat_range(p.weight, 1);
    ops::amax(ctx, shard.flat_range(p.at, p.count), out);   // one piece per weight in a shard
  }
}

void FsdpFp8Scales::cast(Context& ctx, const Tensor& shard, const std::vector<Piece>& pieces, Tensor& out) {
  LMSCALE_CHECK(out.dtype() == DType::e4m3 && out.numel() == shard.numel(),
                "FsdpFp8Scales::cast: out must be fp8_e4m3 [{}], got {} {}", shard.numel(), dtype_name(out.dtype()),
                shape_str(out.shape()));
  for (int g = 0; g < groups(); ++g) {
    const auto gi = static_cast<std::size_t>(g);
    Tensor a = group_amax(g);
    // The max of the members' amaxes, which are >= 0 or NaN: their amax (NaN stays NaN).
    if (group_size_[gi] > 1) ops::amax(ctx, amax_.flat_range(group_first_[gi], group_size_[gi]), a);
    Tensor s = scale(g), i = inv(g);
    ops::fp8_update_scale(ctx, a, Fp8Format::e4m3, margin_, s, i);
  }
  std::int64_t covered = 0;   // pieces lie in shard order, back to back from 0 (fsdp's layout)
  for (const Piece& p : pieces) {
    LMSCALE_CHECK(p.at == covered, "FsdpFp8Scales::cast: pieces must tile the shard from 0 (piece at {}, expected {})",
                  p.at, covered);
    Tensor o = out.flat_range(p.at, p.count);
    ops::cast_fp8(ctx, shard.flat_range(p.at, p.count), scale(group_of(p.weight)), o, nullptr);
    covered += p.count;
  }
  if (covered < shard.numel()) {   // the zero padding: 0 under any scale (group 0's)
    Tensor o = out.flat_range(covered, shard.numel() - covered);
    ops::cast_fp8(ctx, shard.flat_range(covered, shard.numel() - covered), scale(0), o, nullptr);
  }
}

void FsdpFp8Scales::cast_shard(Context& ctx, comm::Communicator& dp, const Tensor& shard,
                               const std::vector<Piece>& pieces, Tensor& out) {
  local_amax(ctx, shard, pieces);
  // The max of the amaxes' bits (lmscale/parallel/fsdp_fp8_gather.h, step 2): one small all-reduce
  // for the unit's P weights; waited on (the compute stream follows it), the casts read it.
  dp.all_reduce(amax_.data(), amax_.data(), static_cast<std::size_t>(weights()), DType::i32, comm::ReduceOp::max);
  cast(ctx, shard, pieces, out);
}

ops::Fp8Weight FsdpFp8Scales::weight(int k, const Tensor& q) const {
  LMSCALE_CHECK(k >= 0 && k < weights(), "FsdpFp8Scales: weight {} of {}", k, weights());
  const int g = group_of(k);
  return {q, group_amax(g), scale(g), inv(g)};
}

}  // namespace lmscale::parallel
