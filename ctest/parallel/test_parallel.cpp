// Data-parallel training must reach the same parameters as one process on the same global batch
// (docs/architecture.md §4). Tiny Transformer, fp32 on CPU, several steps with every DDP variant and every
// ZeRO level: with 2 ranks all variants are bitwise identical to each other (each element is the
// same sum of the same two per-rank values), and equal to one process within 2e-6 relative (the single process
// computes each weight gradient in one GEMM over the whole batch, the ranks over their slices:
// a different summation order). Toy model: ZeRO over uneven shards and a parameter group added
// mid-training, against a single-process AdamW.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <memory>
#include <vector>

#include "lmscale/io/deck.h"
#include "lmscale/comm/factory.h"
#include "lmscale/io/dataset.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/ops/ops.h"
#include "lmscale/optim/adamw.h"
#include "lmscale/parallel/zero.h"
#include "mpi_test_support.h"
#include "parallel_test_util.h"

using namespace lmscale;

namespace {

// The toy problems' optimizer: AdamW with a step and a decay large enough to see in a few steps.
OptimConfig toy_adamw() {
  OptimConfig oc;
  oc.lr = 0.05;
  oc.weight_decay = 0.1;
  return oc;
}

}  // namespace

TEST(DataParallel, EveryVariantMatchesOneProcess) {
  const int steps = 4;
  Config base = test::tiny_config();
  const auto reference = test::train(base, false, steps);
  std::vector<float> first;
  // gather: parallel.overlap_param_gather (zero1/zero2: the parameters' all-gather left in flight
  // for the next forward, which waits per unit).
  struct Case { const char* ddp; const char* zero; int accum; bool gather = false; };
  for (Case c : {Case{"naive", "none", 1}, Case{"flat", "none", 1}, Case{"overlap", "none", 1},
                 Case{"bucketed", "none", 1}, Case{"bucketed", "none", 2}, Case{"flat", "zero1-broadcast", 1},
                 Case{"bucketed", "zero1-broadcast", 1}, Case{"none", "zero1", 1}, Case{"none", "zero1", 1, true},
                 Case{"none", "zero2", 1}, Case{"none", "zero2", 1, true}, Case{"none", "zero2", 2},
                 Case{"none", "zero2", 2, true}}) {
    if (8 / test::mpi_env().size() % c.accum) continue;
    Config cfg = base;
    io::set_key(cfg, "parallel.ddp", c.ddp);
    io::set_key(cfg, "parallel.zero", c.zero);
    cfg.parallel.overlap_param_gather = c.gather;
    cfg.train.grad_accum = c.accum;
    const auto got = test::train(cfg, true, steps);
    ASSERT_EQ(got.size(), reference.size());
    EXPECT_LT(test::max_rel_diff(got, reference), 2e-6) << c.ddp << "/" << c.zero << " accum " << c.accum << " gather " << c.gather;
    // Bitwise only with 2 ranks (a sum of two values has one order) and without accumulation.
    if (c.accum != 1 || test::mpi_env().size() != 2) continue;
    if (first.empty()) first = got;
    else EXPECT_EQ(got, first) << c.ddp << "/" << c.zero << " is not bitwise equal to naive DDP";
  }
}

// SGD, LARS and LAMB (issue 16): DDP and every ZeRO level against one process. ZeRO ranges cut
// parameters anywhere, so LARS/LAMB's per-parameter norms are partial sums all-reduced over the
// ranks; a norm over the shard alone would give other trust ratios and fail the bound.
TEST(DataParallel, OptimizersMatchOneProcess) {
  const int steps = 4;
  for (const char* name : {"sgd", "lars", "lamb"}) {
    const Config base = test::with_optimizer(test::tiny_config(), name);
    const auto initial = test::train(base, false, 0);
    const auto reference = test::train(base, false, steps);
    // The steps moved the weights (a test of equality between two frozen runs would prove nothing).
    EXPECT_GT(test::max_rel_diff(reference, initial), 1e-3) << name;
    struct Case { const char* ddp; const char* zero; int accum; };
    for (Case c : {Case{"flat", "none", 1}, Case{"bucketed", "zero1-broadcast", 1}, Case{"none", "zero1", 1},
                   Case{"none", "zero2", 1}, Case{"none", "zero2", 2}}) {
      if (8 / test::mpi_env().size() % c.accum) continue;
      Config cfg = base;
      io::set_key(cfg, "parallel.ddp", c.ddp);
      io::set_key(cfg, "parallel.zero", c.zero);
      cfg.train.grad_accum = c.accum;
      const auto got = test::train(cfg, true, steps);
      ASSERT_EQ(got.size(), reference.size());
      EXPECT_LT(test::max_rel_diff(got, reference), 2e-6) << name << " " << c.ddp << "/" << c.zero << " accum " << c.accum;
    }
  }
}

// A bf16 working copy (the forward's weights): zero1 and zero2 write their range of it inside
// the optimizer step and all-gather the copy, not the fp32 master, whose other ranges stay as they
// were until complete_master() gathers them, except the ranges the forward reads from the master
// (norm weights; here [1, 3) and [4, 8), which cross shard boundaries), gathered in fp32 after
// every step; zero1-broadcast exchanges the master and casts it. The toy gradients are computed
// as a forward would read the weights (the copy, the master in those ranges): the master must
// track a single-process AdamW fed the same way (1e-6), and the copy must be the rounding of the
// completed master on every rank.
TEST(ZeroOptimizer, WorkingCopyIsGatheredAndMasterCompletedOnDemand) {
  test::HostRankEnv env;
  auto [grads, host] = std::tie(env.grads, env.host);   // references to the unique_ptrs
  HostAllocator& alloc = env.alloc;
  Context& ctx = env.ctx;
  const OptimConfig oc = toy_adamw();
  const int R = grads->size(), r = grads->rank();
  constexpr int n = 11;
  auto target = [](int rank, int i) { return std::sin(0.5 + rank * 0.9 + i * 0.37); };
  const std::vector<std::pair<std::int64_t, std::int64_t>> reads = {{1, 2}, {4, 4}};
  auto read_from_master = [&](int i) { return (i >= 1 && i < 3) || (i >= 4 && i < 8); };
  auto grad_of = [&](const std::vector<float>& master, const std::vector<bf16_t>& low, int rank, int i) {
    const double w = read_from_master(i) ? master[static_cast<std::size_t>(i)] : bf16_to_float(low[static_cast<std::size_t>(i)]);
    return static_cast<float>(w - target(rank, i));
  };
  for (ZeroLevel mode : {ZeroLevel::zero1_broadcast, ZeroLevel::zero1, ZeroLevel::zero2}) {
    std::vector<float> p(n), g(n), rp(n), rg(n);
    std::vector<bf16_t> low(n), rlow(n);
    for (int i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = static_cast<float>(0.3 - 0.05 * i);
    rp = p;
    for (int i = 0; i < n; ++i) low[static_cast<std::size_t>(i)] = rlow[static_cast<std::size_t>(i)] = float_to_bf16(p[static_cast<std::size_t>(i)]);
    Tensor tp = Tensor::view(p.data(), {n}, DType::f32, Device::cpu), tg = Tensor::view(g.data(), {n}, DType::f32, Device::cpu);
    Tensor tlow = Tensor::view(low.data(), {n}, DType::bf16, Device::cpu);
    Tensor trp = Tensor::view(rp.data(), {n}, DType::f32, Device::cpu), trg = Tensor::view(rg.data(), {n}, DType::f32, Device::cpu);
    Tensor trlow = Tensor::view(rlow.data(), {n}, DType::bf16, Device::cpu);
    parallel::ZeroOptimizer z(parallel::zero_mode_of(mode), *grads, *host, oc);
    z.add_group({tp, tg, &tlow, {}, 0, reads}, ctx);
    model::ModelDims d;
    d.vocab = 3; d.d_model = 2; d.d_ff = 2; d.layers = 1; d.heads = 1;
    model::ParameterStore dummy(d, DType::f32, DType::f32, alloc);
    z.make_sync(parallel::DdpMode::flat, dummy, 1.0, ctx);
    optim::AdamW ref(oc, n, DType::f32, ctx);
    const std::int64_t lo = z.shard_begin(0), hi = lo + z.shard_size(0);
    const std::vector<float> initial = p;
    for (int step = 0; step < 3; ++step) {
      for (int i = 0; i < n; ++i) g[static_cast<std::size_t>(i)] = grad_of(p, low, r, i);
      if (mode == ZeroLevel::zero1_broadcast) grads->all_reduce(tg, comm::ReduceOp::sum).wait();
      else z.sync().finish(ctx);
      z.step(ctx, oc.lr, 1.0);
      for (int i = 0; i < n; ++i) {
        double sum = 0;
        for (int q = 0; q < R; ++q) sum += grad_of(rp, rlow, q, i);
        rg[static_cast<std::size_t>(i)] = static_cast<float>(sum);
      }
      ref.step(ctx, trp, trg, &trlow, oc.lr, 1.0);
    }
    const bool partial = mode != ZeroLevel::zero1_broadcast && R > 1;
    for (int i = 0; i < n; ++i) {
      const bool mine = i >= lo && i < hi;
      if (mine || !partial || read_from_master(i)) EXPECT_NEAR(p[static_cast<std::size_t>(i)], rp[static_cast<std::size_t>(i)], 1e-6) << mode << " " << i;
      else EXPECT_EQ(p[static_cast<std::size_t>(i)], initial[static_cast<std::size_t>(i)]) << mode << " " << i << ": the master was exchanged";
    }
    z.complete_master(ctx);
    for (int i = 0; i < n; ++i) {
      EXPECT_NEAR(p[static_cast<std::size_t>(i)], rp[static_cast<std::size_t>(i)], 1e-6) << mode << " " << i;
      EXPECT_EQ(low[static_cast<std::size_t>(i)].bits, float_to_bf16(p[static_cast<std::size_t>(i)]).bits) << mode << " " << i;
    }
  }
}

TEST(ZeroOptimizer, UnevenShardsAndLateGroupMatchOneProcess) {
  test::HostRankEnv env;
  auto [grads, host] = std::tie(env.grads, env.host);   // references to the unique_ptrs
  HostAllocator& alloc = env.alloc;
  Context& ctx = env.ctx;
  const OptimConfig oc = toy_adamw();
  const int R = grads->size(), r = grads->rank();
  // Toy model: loss_r = 0.5 * sum_i (p_i - target_r,i)^2 over groups A (7 elements: uneven over 2,
  // 3, 4 ranks) and B (5 elements, added after step 2); the global gradient is the sum over ranks.
  auto target = [](int rank, int i) { return std::sin(1.0 + rank * 0.7 + i * 0.3); };
  std::vector<float> a(7), b(5), ga(7), gb(5);
  for (int i = 0; i < 7; ++i) a[static_cast<std::size_t>(i)] = static_cast<float>(0.1 * i);
  for (int i = 0; i < 5; ++i) b[static_cast<std::size_t>(i)] = static_cast<float>(-0.2 * i);
  // single-process reference with plain AdamW on the summed gradient
  std::vector<float> ra = a, rb = b, rga(7), rgb(5);
  Tensor tra = Tensor::view(ra.data(), {7}, DType::f32, Device::cpu), trga = Tensor::view(rga.data(), {7}, DType::f32, Device::cpu);
  Tensor trb = Tensor::view(rb.data(), {5}, DType::f32, Device::cpu), trgb = Tensor::view(rgb.data(), {5}, DType::f32, Device::cpu);
  optim::AdamW ref_a(oc, 7, DType::f32, ctx), ref_b(oc, 5, DType::f32, ctx);

  for (ZeroLevel mode : {ZeroLevel::zero1_broadcast, ZeroLevel::zero1, ZeroLevel::zero2}) {
    std::vector<float> pa = a, pb = b;
    Tensor ta = Tensor::view(pa.data(), {7}, DType::f32, Device::cpu), tga = Tensor::view(ga.data(), {7}, DType::f32, Device::cpu);
    Tensor tb = Tensor::view(pb.data(), {5}, DType::f32, Device::cpu), tgb = Tensor::view(gb.data(), {5}, DType::f32, Device::cpu);
    parallel::ZeroOptimizer z(parallel::zero_mode_of(mode), *grads, *host, oc);
    z.add_group({ta, tga, nullptr, {}, 0, {}}, ctx);
    // no backward runs here, so zero2's bucket hooks never fire: finish() then reduce-scatters
    // each group whole, like zero1
    model::ModelDims d;
    d.vocab = 3; d.d_model = 2; d.d_ff = 2; d.layers = 1; d.heads = 1;
    model::ParameterStore dummy(d, DType::f32, DType::f32, alloc);
    z.make_sync(parallel::DdpMode::flat, dummy, 1.0, ctx);
    EXPECT_EQ(z.shard_size(0), 7 / R + (r < 7 % R ? 1 : 0));
    ra = a; rb = b;
    ref_a = optim::AdamW(oc, 7, DType::f32, ctx);
    ref_b = optim::AdamW(oc, 5, DType::f32, ctx);
    for (int step = 0; step < 5; ++step) {
      if (step == 2) z.add_group({tb, tgb, nullptr, {}, 0, {}}, ctx);
      for (int i = 0; i < 7; ++i) ga[static_cast<std::size_t>(i)] = static_cast<float>(pa[static_cast<std::size_t>(i)] - target(r, i));
      for (int i = 0; i < 5; ++i) gb[static_cast<std::size_t>(i)] = static_cast<float>(pb[static_cast<std::size_t>(i)] - target(r, 10 + i));
      if (mode != ZeroLevel::zero1_broadcast) {
        // zero1/zero2 reduce-scatter inside finish(); zero1-broadcast's DataParallel works on the
        // model store, so all-reduce the toy gradients here as the DDP strategy would.
      } else {
        grads->all_reduce(tga, comm::ReduceOp::sum).wait();
        grads->all_reduce(tgb, comm::ReduceOp::sum).wait();
      }
      if (mode != ZeroLevel::zero1_broadcast) z.sync().finish(ctx);
      z.step(ctx, oc.lr, 1.0);
      // reference: the summed gradient computed in double then rounded like the ranks' sum
      for (int i = 0; i < 7; ++i) {
        double s = 0;
        for (int q = 0; q < R; ++q) s += static_cast<float>(ra[static_cast<std::size_t>(i)] - target(q, i));
        rga[static_cast<std::size_t>(i)] = static_cast<float>(s);
      }
      ref_a.step(ctx, tra, trga, nullptr, oc.lr, 1.0);
      if (step >= 2) {
        for (int i = 0; i < 5; ++i) {
          double s = 0;
          for (int q = 0; q < R; ++q) s += static_cast<float>(rb[static_cast<std::size_t>(i)] - target(q, 10 + i));
          rgb[static_cast<std::size_t>(i)] = static_cast<float>(s);
        }
        ref_b.step(ctx, trb, trgb, nullptr, oc.lr, 1.0);
      }
    }
    for (int i = 0; i < 7; ++i) EXPECT_NEAR(pa[static_cast<std::size_t>(i)], ra[static_cast<std::size_t>(i)], 1e-6) << mode << " a" << i;
    for (int i = 0; i < 5; ++i) EXPECT_NEAR(pb[static_cast<std::size_t>(i)], rb[static_cast<std::size_t>(i)], 1e-6) << mode << " b" << i;
    EXPECT_EQ(z.state_bytes(), static_cast<std::size_t>(2 * 4 * (z.shard_size(0) + z.shard_size(1))));
  }
}

// parallel.overlap_param_gather at the strategy: step() leaves the all-gather in flight in the
// ranges given (uneven, across rank boundaries, not in offset order); after their Works are
// waited the parameters are bitwise those of the gather inside step(). Ranges that do not cover
// the group, and zero1-broadcast, are refused.
TEST(ZeroOptimizer, DeferredGathersEqualTheGatherInsideStep) {
  test::HostRankEnv env;
  const OptimConfig oc = toy_adamw();
  const int n = 11, r = env.grads->rank();
  auto target = [](int rank, int i) { return std::cos(0.5 + rank * 0.9 + i * 0.4); };
  const std::vector<std::pair<std::int64_t, std::int64_t>> ranges{{6, 5}, {0, 2}, {2, 4}};
  model::ModelDims d;
  d.vocab = 3; d.d_model = 2; d.d_ff = 2; d.layers = 1; d.heads = 1;
  model::ParameterStore dummy(d, DType::f32, DType::f32, env.alloc);
  for (ZeroLevel mode : {ZeroLevel::zero1, ZeroLevel::zero2}) {
    std::vector<float> plain(n), deferred(n), g1(n), g2(n);
    for (int i = 0; i < n; ++i) plain[static_cast<std::size_t>(i)] = deferred[static_cast<std::size_t>(i)] = static_cast<float>(0.05 * i);
    auto view = [](std::vector<float>& v) { return Tensor::view(v.data(), {static_cast<std::int64_t>(v.size())}, DType::f32, Device::cpu); };
    parallel::ZeroOptimizer zp(parallel::zero_mode_of(mode), *env.grads, *env.host, oc);
    parallel::ZeroOptimizer zd(parallel::zero_mode_of(mode), *env.grads, *env.host, oc);
    zp.add_group({view(plain), view(g1), nullptr, {}, 0, {}}, env.ctx);
    zd.add_group({view(deferred), view(g2), nullptr, {}, 0, {}}, env.ctx);
    zp.make_sync(parallel::DdpMode::flat, dummy, 1.0, env.ctx);
    zd.make_sync(parallel::DdpMode::flat, dummy, 1.0, env.ctx);
    EXPECT_THROW(zd.defer_gathers({{0, 5}, {6, 5}}), Error) << mode;   // element 5 left out
    zd.defer_gathers(ranges);
    for (int step = 0; step < 3; ++step) {
      for (int i = 0; i < n; ++i) {
        g1[static_cast<std::size_t>(i)] = static_cast<float>(plain[static_cast<std::size_t>(i)] - target(r, i));
        g2[static_cast<std::size_t>(i)] = static_cast<float>(deferred[static_cast<std::size_t>(i)] - target(r, i));
      }
      zp.sync().finish(env.ctx);
      zd.sync().finish(env.ctx);
      zp.step(env.ctx, oc.lr, 1.0);
      zd.step(env.ctx, oc.lr, 1.0);
      std::vector<comm::Work> w = zd.take_gathers();
      ASSERT_EQ(w.size(), ranges.size()) << mode;
      EXPECT_TRUE(zd.take_gathers().empty());   // handed out once
      for (auto& x : w) x.wait();
      EXPECT_EQ(deferred, plain) << mode << " step " << step;
    }
  }
  parallel::ZeroOptimizer zb(parallel::ZeroMode::zero1_broadcast, *env.grads, *env.host, oc);
  std::vector<float> p(n), g(n);
  zb.add_group({Tensor::view(p.data(), {n}, DType::f32, Device::cpu), Tensor::view(g.data(), {n}, DType::f32, Device::cpu),
                nullptr, {}, 0, {}}, env.ctx);
  EXPECT_THROW(zb.defer_gathers(ranges), Error);
}

// The trainer defers the gather in segments of parallel.bucket_mb for zero1/zero2 with the key
// on (several segments for the tiny model), not with it off nor for zero1-broadcast.
TEST(ZeroOptimizer, TrainerDefersTheGatherOnlyWhereAsked) {
  struct Case { const char* zero; bool gather; bool expect; };
  for (Case c : {Case{"zero1", true, true}, Case{"zero2", true, true}, Case{"zero2", false, false},
                 Case{"zero1-broadcast", true, false}}) {
    Config cfg = test::tiny_config();
    io::set_key(cfg, "parallel.zero", c.zero);
    io::set_key(cfg, "parallel.ddp", std::string(c.zero) == "zero1-broadcast" ? "flat" : "none");
    cfg.parallel.overlap_param_gather = c.gather;
    test::CpuJobEnv job(cfg);
    jobs::JobEnv& env = job.env;
    jobs::Trainer trainer(env, 8, 1, 2);
    if (c.expect)
      EXPECT_GT(trainer.param_gather_segments(), 2u) << c.zero;
    else
      EXPECT_EQ(trainer.param_gather_segments(), 0u) << c.zero << " gather " << c.gather;
  }
}

TEST(ZeroOptimizer, Zero2HoldsNoFullSizeGradients) {
  // zero1 keeps the flat fp32 gradient buffer (4 B x P) for the whole step; zero2 allocates
  // per-bucket gradient buffers during the backward and frees them once reduce-scattered.
  std::map<std::string, std::size_t> peak;
  for (const char* mode : {"zero1", "zero2"}) {
    Config cfg = test::tiny_config();
    io::set_key(cfg, "parallel.zero", mode);
    test::CpuJobEnv job(cfg);
    jobs::JobEnv& env = job.env;
    jobs::Trainer trainer(env, 8, 1, 2);
    io::SyntheticTokens data(cfg.model.vocab_size, cfg.run.seed);
    const std::int64_t T = cfg.model.context_length;
    std::vector<std::int32_t> tok(static_cast<std::size_t>(trainer.local_rows() * (T + 1)));
    data.sample(0, trainer.first_row(), trainer.local_rows(), T, tok.data(), false);
    trainer.train_step(tok, T);
    const auto& points = trainer.memory_points();
    auto bytes = [&](const char* point) {
      const auto& tags = points.at(point);
      auto it = tags.find("gradients");
      return it == tags.end() ? std::size_t{0} : it->second;
    };
    const std::size_t full = static_cast<std::size_t>(trainer.params().numel()) * 4;
    if (std::string(mode) == "zero1") {
      EXPECT_EQ(bytes("after_init"), full);
      EXPECT_EQ(bytes("after_optimizer"), full);
    } else {
      EXPECT_EQ(bytes("after_init"), 0u);
      EXPECT_EQ(bytes("before_optimizer"), 0u);   // freed right after their reduce-scatter
      EXPECT_FALSE(trainer.params().has_flat_grads());
    }
    peak[mode] = job.rt.allocator().tracker().peak();
  }
  // The whole-step peak drops: zero2 never holds the flat buffer next to all activations.
  EXPECT_LT(peak["zero2"], peak["zero1"]);

  // One process keeps its gradients per bucket too: none exist before the backward or after the
  // optimizer step.
  Config cfg = test::tiny_config();
  test::CpuJobEnv job(cfg, false);
  jobs::JobEnv& env = job.env;
  jobs::Trainer trainer(env, 8, 2, 2);
  io::SyntheticTokens data(cfg.model.vocab_size, cfg.run.seed);
  const std::int64_t T = cfg.model.context_length;
  std::vector<std::int32_t> tok(static_cast<std::size_t>(trainer.local_rows() * (T + 1)));
  data.sample(0, trainer.first_row(), trainer.local_rows(), T, tok.data(), false);
  trainer.train_step(tok, T);
  const auto& tags = trainer.memory_points();
  auto grads_at = [&](const char* point) {
    auto it = tags.at(point).find("gradients");
    return it == tags.at(point).end() ? std::size_t{0} : it->second;
  };
  EXPECT_EQ(grads_at("after_init"), 0u);
  EXPECT_EQ(grads_at("before_optimizer"), static_cast<std::size_t>(trainer.params().numel()) * 4);
  EXPECT_EQ(grads_at("after_optimizer"), 0u);
}
