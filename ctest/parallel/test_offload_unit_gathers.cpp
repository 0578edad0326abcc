// parallel.offload = optimizer under zero1/zero2: the next forward gathers the parameters unit by
// unit, each unit's gather issued once this rank's host update of the unit has landed
// (parallel/zero.h, gather_per_unit). Held by a test seam (OffloadedShards::set_before_unit), the
// host worker of every rank stops before unit `held`: the forward of the units before it must go
// ahead and read their new values (bitwise those of offload = none), while the held units still
// read the old ones; the worker also dawdles at unit 0, so a gather that did not wait for the
// unit's update would send the old values. fp32 (the master itself is gathered) and bf16 (the
// working copy and the packed norm weights; CPU ranks cannot compute in bf16, so the backward is
// replaced by its hooks with synthetic gradients, as in test_offload_working_copy.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "lmscale/core/rng.h"
#include "lmscale/optim/grad_clip.h"
#include "lmscale/parallel/store_offload.h"
#include "lmscale/parallel/zero.h"
#include "parallel_test_util.h"

namespace lmscale::test {
namespace {

using namespace std::chrono_literals;

// Holds the host worker (on its thread) before its first unit >= held until released; a wait
// longer than 10 s is recorded (the forward needed a held unit) and let through, so that a wrong
// implementation fails instead of hanging.
struct Gate {
  int held = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool open = false, timed_out = false;
  void at(int unit) {
    if (unit == 0) std::this_thread::sleep_for(200ms);   // the first unit's update lands late
    if (unit < held) return;
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, 10s, [&] { return open; })) timed_out = open = true;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};

// The bytes the forward reads of each parameter (ParameterStore::compute_weight: the working copy,
// the fp32 norm weights, or the fp32 master).
using Reads = std::vector<std::vector<unsigned char>>;
Reads reads(const model::ParameterStore& store) {
  Reads out;
  for (int i = 0; i < store.size(); ++i) {
    const Tensor w = store.compute_weight(i);
    const auto* p = static_cast<const unsigned char*>(w.data());
    out.emplace_back(p, p + w.nbytes());
  }
  return out;
}

void call(const std::function<void(int)>& f, int u) {
  if (f) f(u);
}

struct UnitReads {
  Reads before, early, after;   // the initial reads; after the next forward's units <= early; after all
  std::vector<int> unit;        // per parameter: its forward unit
};

// One synthetic step (a pure function of parameter, element and dp rank) from the initial
// weights, then the next forward's waits, unit by unit; `gate` (offload only) holds the update.
UnitReads run(const Config& cfg, Gate* gate, int early) {
  CpuJobEnv job(cfg, true);
  jobs::Trainer trainer(job.env, 8, 1, 2);
  model::ParameterStore& store = trainer.params();   // (before the step: params() settles)
  parallel::Strategy& st = trainer.strategy();
  Context& ctx = job.rt.ctx();
  const int L = cfg.model.num_layers;
  UnitReads r;
  for (const auto& p : store.infos()) r.unit.push_back(parallel::forward_unit(p, L));
  r.before = reads(store);
  if (gate) {
    auto* zero = dynamic_cast<parallel::ZeroOptimizer*>(trainer.sharded());
    EXPECT_TRUE(zero && zero->gathers_per_unit());
    if (!zero || !zero->offloaded_shards(0)) return r;
    zero->offloaded_shards(0)->set_before_unit([gate](int u) { gate->at(u); });
  }
  const model::ParallelContext bwd = st.sync().hooks(0, 1);
  for (int u = L + 1; u >= 0; --u) {
    call(bwd.before_backward, u);
    for (int i = store.size() - 1; i >= 0; --i) {
      if (r.unit[static_cast<std::size_t>(i)] != u) continue;
      Tensor g = store.grad(i);
      const CounterRng rng(static_cast<std::uint64_t>(job.env.rank), static_cast<std::uint64_t>(i));
      for (std::int64_t e = 0; e < g.numel(); ++e)
        g.data_as<float>()[e] = static_cast<float>(rng.normal(static_cast<std::uint64_t>(e)) * 1e-2);
      if (bwd.on_grad_ready) bwd.on_grad_ready(i);
    }
    call(bwd.after_backward, u);
  }
  st.sync().finish(ctx);
  const double norm = std::sqrt(st.grad_sum_squares(ctx));
  st.step(ctx, 1e-2, optim::clip_factor(norm, 0.5));
  st.release_gradients();
  const model::ParallelContext fwd = st.forward_hooks(true);
  for (int u = 0; u <= early; ++u) call(fwd.before_forward, u);
  r.early = reads(store);
  if (gate) gate->release();
  for (int u = early + 1; u <= L + 1; ++u) call(fwd.before_forward, u);
  r.after = reads(store);
  return r;
}

TEST(OffloadUnitGathers, EachUnitWaitsOnlyForItsOwnUpdate) {
  // The forward through unit `early` issues the gathers of units <= early + kGatherAhead.
  const int early = 2, held = early + parallel::ZeroOptimizer::kGatherAhead + 1;
  for (const ZeroLevel zero : {ZeroLevel::zero1, ZeroLevel::zero2})
    for (const PrecisionMode precision : {PrecisionMode::fp32, PrecisionMode::bf16}) {
      Config c = tiny_config();
      c.model.num_layers = 4;   // units 0 (embedding) .. 5 (head)
      c.optim.weight_decay = 0.1;
      c.precision.mode = precision;
      c.parallel.zero = zero;
      const std::string what = fmt::format("zero {}, {} on {} ranks", zero, precision, mpi_env().size());
      const UnitReads base = run(c, nullptr, early);
      c.parallel.offload = OffloadMode::optimizer;
      Gate gate;
      gate.held = held;
      const UnitReads off = run(c, &gate, early);
      EXPECT_FALSE(gate.timed_out) << what << ": the forward of units <= " << early
                                   << " waited for the host update of a later unit";
      ASSERT_EQ(base.after.size(), off.after.size()) << what;
      ASSERT_TRUE(base.before == off.before) << what << ": initial weights";
      for (std::size_t i = 0; i < base.after.size(); ++i) {
        const int u = base.unit[i];
        EXPECT_TRUE(base.after[i] != base.before[i]) << what << ": parameter " << i << " did not move (the check could not fail)";
        EXPECT_TRUE(off.after[i] == base.after[i]) << what << ": parameter " << i << " (unit " << u << ") after the forward";
        if (u <= early) {
          EXPECT_TRUE(off.early[i] == base.after[i]) << what << ": unit " << u << " read before its gather was waited for";
        }
        if (u >= held) {
          EXPECT_TRUE(off.early[i] == off.before[i]) << what << ": unit " << u << " changed while its host update was held";
        }
      }
    }
}

}  // namespace
}  // namespace lmscale::test
