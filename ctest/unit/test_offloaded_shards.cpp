// parallel::OffloadedShards (parallel.offload = optimizer under FSDP) on a CPU runtime, where the
// lane's copies are memcpy but the worker thread, the chunk pipeline through two staging slots,
// the per-unit readiness and the settle/refresh rules run as on a GPU: several steps over units
// split into chunks (one unit smaller than a chunk, one empty, one of several chunks with a short
// last one) against ops::adamw over the whole shard, bit for bit, and the bf16 device copy
// against the cast of the master; for both places of that copy: the device (parallel.offload =
// optimizer) and pinned host memory copied up per unit (optimizer+params).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "lmscale/core/rng.h"
#include "lmscale/ops/ops.h"
#include "lmscale/ops/runtime.h"
#include "lmscale/optim/adamw.h"
#include "lmscale/parallel/offloaded_shards.h"

namespace lmscale::test {
namespace {

std::vector<float> random_values(std::int64_t n, std::uint64_t seed, double scale) {
  const CounterRng rng(seed, 7);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(rng.normal(static_cast<std::uint64_t>(i)) * scale);
  return v;
}

Tensor view_of(std::vector<float>& v) { return Tensor::view(v.data(), {static_cast<std::int64_t>(v.size())}, DType::f32, Device::cpu); }

using ShardCopy = parallel::OffloadedShards::ShardCopy;

class OffloadedShardsTest : public ::testing::TestWithParam<ShardCopy> {};

// The units' device shards against round-to-nearest-even bf16 of `master`.
void expect_device_shards(parallel::OffloadedShards& off, Context& ctx,
                          const std::vector<parallel::OffloadedShards::Range>& units, const std::vector<float>& master,
                          const char* when) {
  for (int u : {2, 0, 1}) {
    Tensor d = off.device_shard(ctx, u);
    const auto& r = units[static_cast<std::size_t>(u)];
    ASSERT_EQ(d.numel(), r.count);
    const auto* got = d.data_as<const bf16_t>();
    for (std::int64_t i = 0; i < d.numel(); ++i)
      ASSERT_EQ(got[i].bits, float_to_bf16(master[static_cast<std::size_t>(r.offset + i)]).bits)
          << when << " unit " << u << " element " << i;
  }
}

TEST_P(OffloadedShardsTest, ChunkedHostStepsMatchAdamWBitwise) {
  const ShardCopy copy = GetParam();
  ops::Runtime rt(Device::cpu, 0, false);
  Context& ctx = rt.ctx();
  OptimConfig cfg;
  cfg.name = OptimizerName::adamw;
  cfg.weight_decay = 0.1;
  // Units: 0 = [0, 40) (< a chunk), 1 = empty, 2 = [40, 250) (chunks of 64: 64, 64, 64, 18).
  const std::int64_t S = 250, chunk = 64;
  std::vector<parallel::OffloadedShards::Range> units{{0, 40}, {40, 0}, {40, 210}};
  parallel::OffloadedShards off(rt, S, units, DType::bf16, cfg, 3, copy, chunk);

  std::vector<float> ref = random_values(S, 1, 0.5);
  // Ties of bf16 (1 + 2^-8 lies between 1 and 1 + 2^-7, 1 + 3 x 2^-8 between 1 + 2^-7 and
  // 1 + 2^-6): the refresh from the master rounds them to the even neighbour, as the device cast.
  ref[3] = 1.00390625f;
  ref[47] = 1.01171875f;
  std::memcpy(off.master().data(), ref.data(), ref.size() * sizeof(float));
  off.mark_master_changed();
  expect_device_shards(off, ctx, units, ref, "refresh");
  ASSERT_EQ(float_to_bf16(ref[3]).bits, 0x3f80);
  ASSERT_EQ(float_to_bf16(ref[47]).bits, 0x3f82);
  std::vector<float> ref_m(S, 0.f), ref_v(S, 0.f);
  Tensor rp = view_of(ref), rm = view_of(ref_m), rv = view_of(ref_v);

  for (int t = 1; t <= 4; ++t) {
    std::vector<float> grads = random_values(S, 100 + t, 2.0);
    Tensor g = view_of(grads);
    const double lr = 1e-2 / t, scale = 0.5 + 0.1 * t;
    off.start_step(ctx, g, lr, scale);
    const ops::AdamWStep a = optim::adamw_hyper(cfg, t, lr, scale);
    ops::adamw(ctx, rp, g, rm, rv, a, nullptr);
    // Each unit's device copy, once ready, is the bf16 of the updated master.
    expect_device_shards(off, ctx, units, ref, "step");
    off.settle();
    EXPECT_EQ(0, std::memcmp(off.master().data(), ref.data(), S * sizeof(float))) << "master, step " << t;
    EXPECT_EQ(0, std::memcmp(off.optimizer().state(0).data(), ref_m.data(), S * sizeof(float))) << "m, step " << t;
    EXPECT_EQ(0, std::memcmp(off.optimizer().state(1).data(), ref_v.data(), S * sizeof(float))) << "v, step " << t;
    EXPECT_EQ(off.optimizer().steps(), t);
  }
  // A master written from outside (a checkpoint load) reaches the device copy at the next use.
  off.master().data_as<float>()[45] = 3.0f;
  off.mark_master_changed();
  EXPECT_EQ(off.device_shard(ctx, 2).data_as<const bf16_t>()[5].bits, float_to_bf16(3.0f).bits);
  // Bytes over the bus per step: the gradients down, and (device copy) the 16-bit copy up; the
  // pinned host copy goes up per gather instead, and is held on the host.
  const bool on_host = copy == ShardCopy::pinned_host;
  EXPECT_EQ(off.transfer_bytes_per_step(), S * (on_host ? 4 : 4 + 2));
}

// The one-step-delayed update (parallel.offload_delayed_update, pinned host copies): fed the same
// gradients, the delayed shard's master after each step is the synchronous one's, bit for bit (the
// update itself is unchanged), and the units it hands the forward of step t + 1 are what the
// synchronous shard handed the forward of step t: the parameters one update older. A master
// written from outside reaches both buffers (the next step reads it).
TEST(OffloadedShardsDelayed, ForwardReadsTheUpdateBeforeTheOneInFlight) {
  ops::Runtime rt(Device::cpu, 0, false);
  Context& ctx = rt.ctx();
  OptimConfig cfg;
  cfg.name = OptimizerName::adamw;
  cfg.weight_decay = 0.1;
  const std::int64_t S = 250, chunk = 64;
  std::vector<parallel::OffloadedShards::Range> units{{0, 40}, {40, 0}, {40, 210}};
  parallel::OffloadedShards sync(rt, S, units, DType::bf16, cfg, 3, ShardCopy::pinned_host, chunk);
  parallel::OffloadedShards late(rt, S, units, DType::bf16, cfg, 3, ShardCopy::pinned_host, chunk, true);
  const std::vector<float> init = random_values(S, 1, 0.5);
  for (parallel::OffloadedShards* o : {&sync, &late}) {
    std::memcpy(o->master().data(), init.data(), init.size() * sizeof(float));
    o->mark_master_changed();
  }
  auto shards = [&](parallel::OffloadedShards& o) {   // every unit's copy as the forward gets it, in bf16 bits
    std::vector<std::uint16_t> bits;
    for (int u = 0; u < 3; ++u) {
      Tensor d = o.device_shard(ctx, u);
      for (std::int64_t i = 0; i < d.numel(); ++i) bits.push_back(d.data_as<const bf16_t>()[i].bits);
    }
    return bits;
  };
  std::vector<std::uint16_t> sync_before = shards(sync);   // the forward of step 1: the initial values
  ASSERT_EQ(shards(late), sync_before);
  for (int t = 1; t <= 4; ++t) {
    std::vector<float> grads = random_values(S, 100 + t, 2.0);
    const double lr = 1e-2 / t, scale = 0.5 + 0.1 * t;
    sync.start_step(ctx, view_of(grads), lr, scale);
    late.start_step(ctx, view_of(grads), lr, scale);
    // The forward of step t + 1: the synchronous shard waits for step t's update; the delayed
    // one reads the parameters of step t - 1, which the synchronous forward of step t read.
    const std::vector<std::uint16_t> sync_now = shards(sync), late_now = shards(late);
    EXPECT_EQ(late_now, sync_before) << "the forward after step " << t;
    EXPECT_NE(late_now, sync_now) << "the forward after step " << t << " read the update in flight";
    sync_before = sync_now;
    sync.settle();
    late.settle();
    EXPECT_EQ(0, std::memcmp(late.master().data(), sync.master().data(), S * sizeof(float))) << "master, step " << t;
  }
  // A master written from outside (a checkpoint load): both buffers, so the next forward reads it.
  late.master().data_as<float>()[45] = 3.0f;
  late.mark_master_changed();
  EXPECT_EQ(late.device_shard(ctx, 2).data_as<const bf16_t>()[5].bits, float_to_bf16(3.0f).bits);
  std::vector<float> grads = random_values(S, 200, 2.0);
  late.start_step(ctx, view_of(grads), 1e-3, 1.0);
  EXPECT_EQ(late.device_shard(ctx, 2).data_as<const bf16_t>()[5].bits, float_to_bf16(3.0f).bits)
      << "the forward after a load and one step reads the loaded master";
  late.settle();
}

// One process and zero1/zero2 under bf16 (parallel/store_offload.h): the caller's targets, a bf16
// working copy with an fp32 range inside (a norm weight, read in full precision) that cuts a unit,
// and gradients in pieces (lazy buckets) that cut chunks: per unit, after wait_unit(), the bf16
// targets hold the cast of the updated master and the fp32 target the master itself, bit for bit
// against ops::adamw over the whole range.
TEST(OffloadedShardsTargets, MixedTargetsAndGradientPiecesMatchAdamWBitwise) {
  ops::Runtime rt(Device::cpu, 0, false);
  Context& ctx = rt.ctx();
  OptimConfig cfg;
  cfg.name = OptimizerName::adamw;
  cfg.weight_decay = 0.1;
  const std::int64_t S = 200, chunk = 48;
  // Units [0, 70), [70, 200); targets: bf16 [0, 90), fp32 [90, 110), bf16 [110, 200).
  std::vector<parallel::OffloadedShards::Range> units{{0, 70}, {70, 130}};
  Tensor low = Tensor::empty({S}, DType::bf16, rt.host(), "test"), full = Tensor::empty({S}, DType::f32, rt.host(), "test");
  // The fp32 range also refreshes its working-copy entries (`also`: low [90, 110)).
  std::vector<parallel::OffloadedShards::Target> targets{{0, 90, low.flat_range(0, 90), Tensor()},
                                                         {90, 20, full.flat_range(90, 20), low.flat_range(90, 20)},
                                                         {110, 90, low.flat_range(110, 90), Tensor()}};
  parallel::OffloadedShards off(rt, S, units, targets, DType::bf16, cfg, 2, chunk);
  std::vector<float> ref = random_values(S, 5, 0.5), ref_m(S, 0.f), ref_v(S, 0.f);
  std::memcpy(off.master().data(), ref.data(), ref.size() * sizeof(float));
  off.mark_master_changed();
  Tensor rp = view_of(ref), rm = view_of(ref_m), rv = view_of(ref_v);
  auto expect_targets = [&](const char* when) {
    for (std::int64_t i = 0; i < S; ++i) {
      if (i >= 90 && i < 110) {
        ASSERT_EQ(full.data_as<const float>()[i], ref[static_cast<std::size_t>(i)]) << when << " element " << i;
      }
      // Every working-copy entry, the fp32 range's too, is the bf16 of the master.
      ASSERT_EQ(low.data_as<const bf16_t>()[i].bits, float_to_bf16(ref[static_cast<std::size_t>(i)]).bits)
          << when << " element " << i;
    }
  };
  off.wait_unit(ctx, 0);   // the refresh from the master
  expect_targets("refresh");
  for (int t = 1; t <= 3; ++t) {
    std::vector<float> grads = random_values(S, 300 + t, 2.0);
    std::vector<ops::GradPiece> pieces;
    for (const auto& [a, n] : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 33}, {33, 100}, {133, 67}})
      pieces.push_back({a, Tensor::view(grads.data() + a, {n}, DType::f32, Device::cpu)});
    const double lr = 1e-2, scale = 0.7;
    off.start_step(ctx, pieces, lr, scale);
    const ops::AdamWStep a = optim::adamw_hyper(cfg, t, lr, scale);
    Tensor g = view_of(grads);
    ops::adamw(ctx, rp, g, rm, rv, a, nullptr);
    off.wait_unit(ctx, 0);
    off.wait_unit(ctx, 1);
    expect_targets("step");
    off.settle();
    EXPECT_EQ(0, std::memcmp(off.master().data(), ref.data(), S * sizeof(float))) << "master, step " << t;
  }
  // Gradients down, and up: 2 bytes per bf16 element, 4 + 2 per fp32 one with its bf16 entry.
  EXPECT_EQ(off.transfer_bytes_per_step(), S * 4 + 180 * 2 + 20 * (4 + 2));
}

// OffloadedShards lets go of each gradient piece once its bytes are on the host (ops::GradPiece
// holds a lazy bucket; the strategy frees its own handle when the next forward reaches the
// bucket's unit): after wait_unit(0), the pieces ending in unit 0's chunks are back in the
// allocator while the update of the later chunks may still run; after settle(), all of them.
// Pieces [0, 33) and [33, 48) end in chunk 0 (unit 0 = [0, 48) is one chunk); [48, 200) is still
// held until its chunks are done.
TEST(OffloadedShardsTargets, LetsGoOfGradientPiecesOnceCopiedDown) {
  ops::Runtime rt(Device::cpu, 0, false);
  Context& ctx = rt.ctx();
  OptimConfig cfg;
  cfg.name = OptimizerName::adamw;
  const std::int64_t S = 200, chunk = 48;
  std::vector<parallel::OffloadedShards::Range> units{{0, 48}, {48, 152}};
  Tensor low = Tensor::empty({S}, DType::bf16, rt.host(), "test");
  std::vector<parallel::OffloadedShards::Target> targets{{0, S, low, Tensor()}};
  parallel::OffloadedShards off(rt, S, units, targets, DType::bf16, cfg, 2, chunk);
  off.wait_unit(ctx, 0);   // the refresh from the master
  auto gradient_bytes = [&] {
    const auto& tags = rt.allocator().tracker().by_tag();
    const auto it = tags.find("test_gradients");
    return it == tags.end() ? std::size_t{0} : it->second;
  };
  std::vector<ops::GradPiece> pieces;
  for (const auto& [a, n] : std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 33}, {33, 15}, {48, 152}}) {
    Tensor g = Tensor::empty({n}, DType::f32, rt.allocator(), "test_gradients");
    ops::fill(ctx, g, 0.25);
    pieces.push_back({a, g});
  }
  ASSERT_EQ(gradient_bytes(), S * sizeof(float));
  off.start_step(ctx, std::move(pieces), 1e-2, 1.0);   // the only handles are the worker's now
  off.wait_unit(ctx, 0);
  EXPECT_LE(gradient_bytes(), 152 * sizeof(float)) << "unit 0's pieces are still held after their copy down";
  off.settle();
  EXPECT_EQ(gradient_bytes(), 0u) << "pieces held after the update";
}

// A shard whose first units are empty (a ZeRO range that starts at a later unit): waiting for
// them waits for nothing, not for the first chunk of the next unit. The worker is held before its
// first unit (OffloadedShards::set_before_unit) until the waits for the empty units returned.
TEST(OffloadedShardsUnits, EmptyUnitsWaitForNothing) {
  ops::Runtime rt(Device::cpu, 0, false);
  Context& ctx = rt.ctx();
  OptimConfig cfg;
  cfg.name = OptimizerName::adamw;
  const std::int64_t S = 100;
  std::vector<parallel::OffloadedShards::Range> units{{0, 0}, {0, 0}, {0, 60}, {60, 40}};
  parallel::OffloadedShards off(rt, S, units, DType::bf16, cfg, 1, ShardCopy::device, 32);
  std::mutex mu;
  std::condition_variable cv;
  bool open = false, held_too_long = false;
  std::vector<int> seen;   // the units the worker started, in order
  off.set_before_unit([&](int u) {
    std::unique_lock<std::mutex> lock(mu);
    seen.push_back(u);
    if (!cv.wait_for(lock, std::chrono::seconds(10), [&] { return open; })) held_too_long = open = true;
  });
  std::vector<float> grads = random_values(S, 3, 1.0);
  off.start_step(ctx, view_of(grads), 1e-2, 1.0);
  off.wait_unit(ctx, 0);
  off.wait_unit(ctx, 1);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_FALSE(held_too_long) << "the wait for an empty unit waited for the next unit's update";
    open = true;
  }
  cv.notify_all();
  off.wait_unit(ctx, 3);
  off.settle();
  EXPECT_EQ(seen, (std::vector<int>{2, 3}));   // once per unit with elements, in forward order
}

INSTANTIATE_TEST_SUITE_P(Copies, OffloadedShardsTest, ::testing::Values(ShardCopy::device, ShardCopy::pinned_host),
                         [](const ::testing::TestParamInfo<ShardCopy>& copy_info) {
                           return copy_info.param == ShardCopy::device ? "device" : "pinned_host";
                         });

}  // namespace
}  // namespace lmscale::test
