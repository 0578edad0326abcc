// train.cuda_graphs (docs/architecture.md §5, "The captured step"): the train step captured as a
// CUDA graph and replayed must give the SAME BITS as the eager step. Self-checking on one GPU:
// - the pieces: ops::clip_grad_scale on CUDA against the CPU's (bitwise), AdamW with its scalars
//   from device memory against AdamW with host scalars (bitwise, and no update on a non-finite
//   norm), the allocator's graph pool (blocks reserved while the graph lives, returned after);
// - whole runs through jobs::Trainer, with and without graphs on the same tokens: every step's
//   loss, gradient norm, lr and skipped flag, and at the end the fp32 parameters and AdamW's m and
//   v, bitwise, in fp32, bf16, fp16 (loss scaling: skipped steps and re-captures), fp8 current
//   and delayed scaling (Hopper; delayed: the amax histories' record slots advance on the
//   device), with clipping active, warm-up lr, grad_accum 2, activation checkpointing and a
//   change of sequence length (a re-capture).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lmscale/comm/mpi_environment.h"
#include "lmscale/core/cuda/device_allocator.h"
#include "lmscale/io/results.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/ops/cuda_graph.h"
#include "lmscale/ops/device_step.h"
#include "lmscale/ops/ops.h"
#include "lmscale/ops/runtime.h"
#include "model_run_util.h"
#include "lmscale/optim/grad_clip.h"

using namespace lmscale;

namespace {

using test::mpi_once;
using test::tokens;

bool hopper() {
  ops::Runtime rt(Device::cuda, 0, false);
  return rt.compute_capability() / 10 == 9;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::vector<float> to_host(ops::Runtime& rt, const Tensor& t) {
  std::vector<float> h(static_cast<std::size_t>(t.numel()));
  Tensor view = Tensor::view(h.data(), {t.numel()}, DType::f32, Device::cpu);
  ops::copy(rt.ctx(), t, view);
  return h;
}

// Index of the first element whose bits differ, or -1.
std::int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<std::int64_t>(i);
  return -1;
}

Tensor upload(ops::Runtime& rt, const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::f32, rt.allocator(), "test");
  Tensor h = Tensor::view(const_cast<float*>(v.data()), {t.numel()}, DType::f32, Device::cpu);
  ops::copy(rt.ctx(), h, t);
  return t;
}

std::vector<float> random_values(std::size_t n, unsigned seed, float scale) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace

// ---- the pieces --------------------------------------------------------------------------------

TEST(CudaGraphPieces, ClipGradScaleMatchesTheCpuBitwise) {
  ops::Runtime gpu(Device::cuda, 0, false), cpu(Device::cpu, 0, false);
  for (unsigned seed = 1; seed <= 30; ++seed) {
    const std::vector<float> partials = random_values(1 + seed % 40, seed, 5.f);
    std::vector<float> squares(partials.size());
    for (std::size_t i = 0; i < partials.size(); ++i) squares[i] = partials[i] * partials[i];
    const double inv_scale = seed % 2 ? 1.0 / 32768.0 : 1.0;
    const double max_norm = seed % 5 == 0 ? 0.0 : 0.1 * seed;
    Tensor dp = upload(gpu, squares);
    Tensor dout = Tensor::empty({ops::kClipSlots}, DType::f64, gpu.allocator(), "test");
    ops::clip_grad_scale(gpu.ctx(), dp, inv_scale, max_norm, dout);
    Tensor hp = Tensor::view(squares.data(), {dp.numel()}, DType::f32, Device::cpu);
    Tensor hout = Tensor::empty({ops::kClipSlots}, DType::f64, cpu.allocator(), "test");
    ops::clip_grad_scale(cpu.ctx(), hp, inv_scale, max_norm, hout);
    Tensor back = Tensor::empty({ops::kClipSlots}, DType::f64, cpu.allocator(), "test");
    ops::copy(gpu.ctx(), dout, back);
    for (std::int64_t k = 0; k < ops::kClipSlots; ++k)
      EXPECT_TRUE(same_bits(back.data_as<double>()[k], hout.data_as<double>()[k]))
          << "seed " << seed << " slot " << k << ": " << back.data_as<double>()[k] << " vs " << hout.data_as<double>()[k];
  }
}

// AdamW with its scalars in device memory (a captured step's) against host scalars: same bits in
// p, m, v and the bf16 copy over several steps; nothing written when the finite flag is 0.
TEST(CudaGraphPieces, AdamWFromDeviceScalarsMatchesHostScalars) {
  ops::Runtime rt(Device::cuda, 0, false);
  Context& ctx = rt.ctx();
  const std::size_t n = 4096 + 13;   // a tail past the 8-element chunks too
  auto state = [&] {
    struct S {
      Tensor p, m, v, low;
    } s{upload(rt, random_values(n, 1, 1.f)), upload(rt, std::vector<float>(n, 0.f)),
        upload(rt, std::vector<float>(n, 0.f)), Tensor::empty({static_cast<std::int64_t>(n)}, DType::bf16, rt.allocator(), "t")};
    return s;
  };
  auto host = state(), dev = state();
  Tensor scalars = Tensor::empty({ops::kAdamWScalars}, DType::f32, rt.allocator(), "test");
  Tensor clip = Tensor::empty({ops::kClipSlots}, DType::f64, rt.allocator(), "test");
  for (int t = 1; t <= 4; ++t) {
    const Tensor g = upload(rt, random_values(n, 100 + t, 0.3f));
    const double lr = 1e-3 * t, grad_scale = 0.37 / t;
    ops::AdamWStep a;
    a.lr = lr;
    a.step = t;
    a.grad_scale = grad_scale;
    a.weight_decay = 0.1;
    ops::adamw(ctx, host.p, g, host.m, host.v, a, &host.low);
    // The device's clip slots as clip_grad_scale writes them (norm unused by the kernel).
    const double slots[ops::kClipSlots] = {1.0, grad_scale, 1.0};
    rt.synchronize();   // (the last step's kernel reads clip; cudaMemcpy is not ordered on the stream)
    ASSERT_EQ(cudaMemcpy(clip.data(), slots, sizeof slots, cudaMemcpyHostToDevice), cudaSuccess);
    ops::AdamWStep d = a;
    d.grad_scale = 1.0;   // ignored: the kernel reads clip's
    ops::adamw_upload_scalars(ctx, d, scalars);
    d.device_scalars = &scalars;
    d.device_clip = &clip;
    ops::adamw(ctx, dev.p, g, dev.m, dev.v, d, &dev.low);
  }
  EXPECT_EQ(first_difference(to_host(rt, host.p), to_host(rt, dev.p)), -1);
  EXPECT_EQ(first_difference(to_host(rt, host.m), to_host(rt, dev.m)), -1);
  EXPECT_EQ(first_difference(to_host(rt, host.v), to_host(rt, dev.v)), -1);
  // A non-finite norm: the kernel writes nothing.
  const std::vector<float> before = to_host(rt, dev.p);
  const double skip[ops::kClipSlots] = {NAN, NAN, 0.0};
  rt.synchronize();
  ASSERT_EQ(cudaMemcpy(clip.data(), skip, sizeof skip, cudaMemcpyHostToDevice), cudaSuccess);
  ops::AdamWStep d;
  d.step = 5;
  d.device_scalars = &scalars;
  d.device_clip = &clip;
  const Tensor g = upload(rt, random_values(n, 7, 1.f));
  ops::adamw(ctx, dev.p, g, dev.m, dev.v, d, &dev.low);
  EXPECT_EQ(first_difference(to_host(rt, dev.p), before), -1);
}

// The graph pool: blocks the capture took stay the graph's (an allocation after the capture gets
// other memory), the replay computes on them, and they return to the cache with the graph.
TEST(CudaGraphPieces, GraphPoolReservesItsBlocksUntilTheGraphGoes) {
  ops::Runtime rt(Device::cuda, 0, false);
  Context& ctx = rt.ctx();
  auto& alloc = dynamic_cast<CudaCachingAllocator&>(rt.allocator());
  Tensor out = Tensor::empty({1024}, DType::f32, rt.allocator(), "out");
  {
    // Warm the cache: a 4 MiB block freed into the shared cache.
    Tensor warm = Tensor::empty({1 << 20}, DType::f32, rt.allocator(), "warm");
    void* warm_ptr = warm.data();
    warm = Tensor();
    ops::CudaGraph graph(rt);
    void* inside = nullptr;
    graph.capture([&] {
      EXPECT_TRUE(rt.capturing());
      Tensor tmp = Tensor::empty({1 << 20}, DType::f32, rt.allocator(), "tmp");
      inside = tmp.data();
      ops::fill(ctx, tmp, 2.5);
      Tensor head = tmp.flat_range(0, 1024);
      ops::copy(ctx, head, out);
    });
    EXPECT_FALSE(rt.capturing());
    EXPECT_EQ(inside, warm_ptr) << "the capture should take the warm cached block";
    EXPECT_GE(graph.pool_bytes(), std::size_t{4} << 20);
    EXPECT_GE(graph.nodes(), 2u);
    // The capture ran nothing; the replay does.
    ops::fill(ctx, out, 0.0);
    graph.replay();
    for (float v : to_host(rt, out)) ASSERT_EQ(v, 2.5f);
    // The freed capture block is the graph's: a same-size allocation now gets another block.
    Tensor other = Tensor::empty({1 << 20}, DType::f32, rt.allocator(), "other");
    EXPECT_NE(other.data(), inside);
    other = Tensor();
    graph.replay();
    rt.synchronize();
  }
  // The graph is gone: its block is in the shared cache again.
  const auto before = alloc.stats();
  Tensor again = Tensor::empty({1 << 20}, DType::f32, rt.allocator(), "again");
  EXPECT_EQ(alloc.stats().device_mallocs, before.device_mallocs);
}

// ---- whole runs through the Trainer ---------------------------------------------------------------

namespace {

struct RunSpec {
  std::string name;
  PrecisionMode mode = PrecisionMode::fp32;
  bool flash = false;
  std::int64_t grad_accum = 1;
  Checkpointing recompute = Checkpointing::none;
  bool change_length = false;   // steps 4 and 5 at T/2: a new shape, then the old one again
  Fp8Scaling scaling = Fp8Scaling::current;
};

void PrintTo(const RunSpec& s, std::ostream* os) { *os << s.name; }

struct RunResult {
  std::vector<jobs::StepResult> steps;
  std::vector<float> params, m, v;
  jobs::GraphStats graphs;
};

constexpr int kSteps = 9;
constexpr std::int64_t kT = 32, kB = 4, kV = 101;

RunResult run(const RunSpec& spec, bool graphs) {
  Config cfg;
  cfg.model.vocab_size = kV;
  cfg.model.context_length = kT;
  cfg.model.d_model = 64;
  cfg.model.d_ff = 176;   // FP8 widths: multiples of 16
  cfg.model.num_layers = 2;
  cfg.model.num_heads = 4;
  cfg.model.attention = spec.flash ? AttentionImpl::flash : AttentionImpl::naive;
  cfg.precision.mode = spec.mode;
  cfg.precision.fp8_scaling = spec.scaling;
  if (spec.scaling == Fp8Scaling::delayed) cfg.precision.fp8_history = 4;   // the window wraps within the run
  cfg.optim.grad_clip = 0.05;   // below the norms of these steps: clipping is active
  cfg.optim.warmup_steps = 3;   // lr changes every step
  cfg.optim.weight_decay = 0.1;
  cfg.train.grad_accum = spec.grad_accum;
  cfg.train.activation_checkpointing = spec.recompute;
  cfg.train.cuda_graphs = graphs;
  cfg.parallel.device = DeviceChoice::cuda;
  ops::Runtime rt(Device::cuda, 0, false);
  io::ResultsFile out("/nonexistent/never.h5", false);
  jobs::JobEnv env{cfg, mpi_once(), rt, out, 0, 1, 0, nullptr, nullptr};
  jobs::Trainer tr(env, kB, spec.grad_accum, kSteps);
  RunResult r;
  for (int s = 0; s < kSteps; ++s) {
    const std::int64_t T = spec.change_length && (s == 4 || s == 5) ? kT / 2 : kT;
    r.steps.push_back(tr.train_step(tokens(kB, T, kV, 50 + s), T));
  }
  r.params = tr.full_parameters();
  optim::Optimizer* opt = tr.optimizer();
  r.m = to_host(rt, opt->state(0));
  r.v = to_host(rt, opt->state(1));
  r.graphs = tr.graph_stats();
  return r;
}

}  // namespace

class CudaGraphTrainer : public ::testing::TestWithParam<RunSpec> {};

TEST_P(CudaGraphTrainer, ReplaysGiveTheEagerStepsBits) {
  const RunSpec& spec = GetParam();
  if (spec.mode == PrecisionMode::fp8 && !hopper()) GTEST_SKIP() << "FP8 GEMMs need a Hopper GPU";
  const RunResult eager = run(spec, false), eager_again = run(spec, false), graphed = run(spec, true);
  // The comparison means something only if two eager runs agree bitwise.
  for (int s = 0; s < kSteps; ++s)
    ASSERT_TRUE(same_bits(eager.steps[static_cast<std::size_t>(s)].loss, eager_again.steps[static_cast<std::size_t>(s)].loss))
        << "two eager runs differ at step " << s + 1 << ": the eager step is not deterministic";
  ASSERT_EQ(first_difference(eager.params, eager_again.params), -1) << "two eager runs end with different parameters";
  int clipped = 0;
  for (int s = 0; s < kSteps; ++s) {
    const auto& e = eager.steps[static_cast<std::size_t>(s)];
    const auto& g = graphed.steps[static_cast<std::size_t>(s)];
    std::printf("  %s step %d  loss %.9f / %.9f  norm %.9g / %.9g  lr %.3g  skipped %d / %d\n", spec.name.c_str(),
                s + 1, e.loss, g.loss, e.grad_norm, g.grad_norm, e.lr, e.skipped, g.skipped);
    EXPECT_TRUE(same_bits(e.loss, g.loss)) << "step " << s + 1;
    EXPECT_TRUE(same_bits(e.grad_norm, g.grad_norm)) << "step " << s + 1;
    EXPECT_TRUE(same_bits(e.lr, g.lr)) << "step " << s + 1;
    EXPECT_EQ(e.skipped, g.skipped) << "step " << s + 1;
    EXPECT_TRUE(same_bits(e.loss_scale, g.loss_scale)) << "step " << s + 1;
    if (!e.skipped && e.grad_norm > 0.05) ++clipped;
  }
  EXPECT_GT(clipped, 0) << "clipping never applied: the test does not check the device-side clip";
  EXPECT_EQ(first_difference(eager.params, graphed.params), -1) << "parameters";
  EXPECT_EQ(first_difference(eager.m, graphed.m), -1) << "AdamW m";
  EXPECT_EQ(first_difference(eager.v, graphed.v), -1) << "AdamW v";
  // The graphs really ran: each key's first step eager, its second captured, then replays.
  std::printf("  %s: %lld captures, %lld replays, %lld eager steps, %zu nodes, %.1f MiB pool\n", spec.name.c_str(),
              static_cast<long long>(graphed.graphs.captures), static_cast<long long>(graphed.graphs.replays),
              static_cast<long long>(graphed.graphs.eager_steps), graphed.graphs.nodes,
              static_cast<double>(graphed.graphs.pool_bytes) / 1048576.0);
  EXPECT_EQ(graphed.graphs.replays + graphed.graphs.eager_steps, kSteps);
  EXPECT_EQ(eager.graphs.replays, 0);
  if (spec.mode == PrecisionMode::fp16) {
    EXPECT_GE(graphed.graphs.replays, 1);   // loss-scale changes re-key the graph
  } else if (spec.change_length) {
    // T: eager, capture+replay, replay, replay | T/2: eager, capture+replay | T: eager, capture+replay, replay
    EXPECT_EQ(graphed.graphs.captures, 3);
    EXPECT_EQ(graphed.graphs.eager_steps, 3);
  } else {
    EXPECT_EQ(graphed.graphs.captures, 1);
    EXPECT_EQ(graphed.graphs.replays, kSteps - 1);
  }
  EXPECT_GT(graphed.graphs.nodes, 20u);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, CudaGraphTrainer,
    ::testing::Values(RunSpec{"fp32", PrecisionMode::fp32}, RunSpec{"bf16", PrecisionMode::bf16},
                      RunSpec{"bf16_flash", PrecisionMode::bf16, true},
                      RunSpec{"bf16_accum2_recompute", PrecisionMode::bf16, true, 2, Checkpointing::every_k},
                      RunSpec{"fp32_length_change", PrecisionMode::fp32, false, 1, Checkpointing::none, true},
                      RunSpec{"fp16_loss_scaling", PrecisionMode::fp16},
                      RunSpec{"fp8_current", PrecisionMode::fp8, true},
                      RunSpec{"fp8_delayed", PrecisionMode::fp8, true, 1, Checkpointing::none, false, Fp8Scaling::delayed}),
    [](const auto& i) { return i.param.name; });
