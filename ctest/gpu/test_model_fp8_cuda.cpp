// precision.mode = fp8 on the GPU against its CPU emulation (docs/precision.md, "FP8 training"):
// the model's FP8 layers (ops::Fp8Linear, cuBLASLt FP8 GEMMs on bf16 activations) against the
// same model on the CPU (the exact FP8 numerics around fp32 compute). Skipped (exit 77) without a
// GPU, and each test skips itself on a GPU that is not Hopper (the FP8 GEMMs need compute
// capability 9.x).
//
// Bounds. The GPU quantises bf16 activations and weights, the CPU fp32 ones: an element whose
// fp32 value lies near a midpoint between two e4m3 values may round the other way after the bf16
// rounding (one e4m3 step, 6%), and the bf16 model's own difference from fp32 is bounded by 3e-2
// in test_model_cuda.cpp. Where the two sides' rounding of an operand differs, the FP8 layers
// amplify it: e5m2 gradients carry 2 mantissa bits (a flipped rounding moves an element by 12-25%),
// and the difference compounds through the layers into every parameter, the bf16 ones included.
// Measured on an H100 (2026-11-27): per parameter 3.2e-2 to 1.45e-1 (relative 2-norm; the largest
// on layer 0's q/k/v, the smallest on the LM head, which stays bf16). The bound, 2.5e-1, is that
// maximum with a margin; the errors this test exists to catch (a wrong scale, inverse or operand
// layout) are expected to give 1 or more (an estimate: no such mutation has run on a GPU). The
// loss must agree within 1e-2 relative, and the GPU's FP8 run must differ from its bf16 run (the
// FP8 layers ran: their e4m3 rounding moves the gradients by about 1e-2, far above bf16's
// run-to-run 0). The measurement above predates precision.fp8_fast_accum, whose default (forward)
// now runs the forward products with fast accumulation: at this model's reduction lengths (K = 64,
// 176) its bound, (ceil(K/32) + 1) 2^-10 of sum |p q| per element (docs/precision.md), adds at
// most 6.8e-3, small beside the e4m3 steps (6%) the bounds above are made of; none is widened
// (the test passed with it on an H100, 2026-11-28).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "lmscale/comm/mpi_environment.h"
#include "lmscale/io/results.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/model/fp8_layers.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/ops.h"
#include "lmscale/ops/runtime.h"
#include "model_run_util.h"

using namespace lmscale;

namespace {

using test::mpi_once;
using test::tokens;

constexpr double kGradTol = 2.5e-1, kLossTol = 1e-2;

model::ModelDims dims(bool flash) {
  model::ModelDims d;
  d.vocab = 101;
  d.context = 40;
  d.d_model = 64;
  d.d_ff = 176;   // every FP8 width a multiple of 16
  d.layers = 2;
  d.heads = 4;
  d.flash = flash;
  return d;
}

bool hopper() {
  ops::Runtime rt(Device::cuda, 0, false);
  return rt.compute_capability() / 10 == 9;
}

// `passes` forwards and backwards of the same tokens from weights of seed 5 (the last one's loss
// and gradients): fp8 under the options o (default: current scaling) or plain. histories (when
// given): every FP8 operand's amax history, scale and inverse after the last, as raw bits.
test::LossAndGrads run(Device device, DType lowp, bool fp8, bool flash, const std::vector<std::int32_t>& tok,
                       std::int64_t B, std::int64_t T, const ops::Fp8LinearOptions& o = {},
                       std::vector<std::uint32_t>* histories = nullptr, int passes = 1) {
  ops::Runtime rt(device, 0, false);
  const auto d = dims(flash);
  model::ParameterStore ps(d, DType::f32, lowp, rt.allocator());
  ps.init(5, rt.ctx());
  model::TransformerLM m(d, ps);
  if (fp8) m.enable_fp8(rt.ctx(), o);
  test::LossAndGrads r;
  for (int i = 0; i < passes; ++i) r = test::forward_backward(rt, m, ps, tok, B, T);
  if (fp8 && histories)
    for (int l = 0; l < d.layers; ++l)
      for (const model::Fp8Gemm g : model::kFp8BlockGemms) {
        const ops::Fp8Linear& lin = m.fp8()->at(l, g);
        for (const ops::Fp8TensorScaling* s : {&lin.x_scaling(), &lin.w_scaling(), &lin.dy_scaling()})
          for (const Tensor* t : {&s->amax_history(), &s->scale(), &s->inv_scale()}) {
            Tensor h = Tensor::empty(t->shape(), DType::f32, rt.host());
            ops::copy(rt.ctx(), *t, h);
            for (std::int64_t i = 0; i < h.numel(); ++i) {
              std::uint32_t u;
              std::memcpy(&u, h.data_as<float>() + i, 4);
              histories->push_back(u);
            }
          }
      }
  return r;
}

}  // namespace

class ModelFp8Cuda : public ::testing::TestWithParam<bool> {};

TEST_P(ModelFp8Cuda, LossAndGradientsMatchTheCpuEmulation) {
  if (!hopper()) GTEST_SKIP() << "FP8 GEMMs need a Hopper GPU";
  const bool flash = GetParam();
  const std::int64_t B = 2, T = 32;   // 64 rows: the weight gradients' reduction, a multiple of 16
  const auto tok = tokens(B, T, 101, 21);
  const auto cpu = run(Device::cpu, DType::f32, true, flash, tok, B, T);
  const auto gpu = run(Device::cuda, DType::bf16, true, flash, tok, B, T);
  const auto gpu_bf16 = run(Device::cuda, DType::bf16, false, flash, tok, B, T);
  std::printf("  loss cpu emulation %.6f  gpu fp8 %.6f  gpu bf16 %.6f\n", cpu.loss, gpu.loss, gpu_bf16.loss);
  EXPECT_NEAR(gpu.loss, cpu.loss, kLossTol * cpu.loss);
  double fp8_vs_bf16 = 0;
  for (const auto& p : model::parameter_layout(dims(flash))) {
    for (std::int64_t i = p.offset; i < p.offset + p.numel; ++i)
      ASSERT_TRUE(std::isfinite(gpu.grads[static_cast<std::size_t>(i)])) << p.name;
    const double e = test::rel_err(gpu.grads, cpu.grads, p.offset, p.numel);
    std::printf("  %-32s fp8 gpu vs cpu emulation %.2e\n", p.name.c_str(), e);
    EXPECT_LT(e, kGradTol) << p.name;
    fp8_vs_bf16 = std::max(fp8_vs_bf16, test::rel_err(gpu.grads, gpu_bf16.grads, p.offset, p.numel));
  }
  EXPECT_GT(fp8_vs_bf16, 1e-3) << "the GPU's fp8 gradients equal its bf16 ones: the FP8 layers did not run";
}

// Current scaling's producer amaxes (the norms' and SwiGLU's kernels writing their outputs' amaxes,
// docs/precision.md) against separate amax passes: bitwise the same loss, gradients, amax
// histories, scales and inverses (an amax is exact, so nothing may move at all).
TEST_P(ModelFp8Cuda, ProducerAmaxesAreBitwiseTheSeparatePasses) {
  if (!hopper()) GTEST_SKIP() << "FP8 GEMMs need a Hopper GPU";
  const bool flash = GetParam();
  const std::int64_t B = 2, T = 32;
  for (unsigned seed : {21u, 22u}) {
    const auto tok = tokens(B, T, 101, seed);
    std::vector<std::uint32_t> h_passes, h_fused;
    ops::Fp8LinearOptions separate;
    separate.producer_amax = false;
    const auto passes = run(Device::cuda, DType::bf16, true, flash, tok, B, T, separate, &h_passes);
    const auto fused = run(Device::cuda, DType::bf16, true, flash, tok, B, T, {}, &h_fused);
    EXPECT_EQ(fused.loss, passes.loss) << "seed " << seed;
    EXPECT_EQ(fused.grads, passes.grads) << "seed " << seed;
    EXPECT_EQ(h_fused, h_passes) << "seed " << seed << ": amax histories or scales differ";
    EXPECT_FALSE(h_fused.empty());
  }
}

// Delayed scaling's casts fused into SwiGLU and its backward (docs/precision.md, "Casts fused into
// the producers": g and da|db never stored in bf16) against the separate casts: bitwise the same
// loss, gradients, amax histories, scales and inverses, over three passes (the first casts with
// the initial scale 1, the later ones with scales from the recorded amaxes).
TEST_P(ModelFp8Cuda, DelayedProducerCastsAreBitwiseTheSeparateCasts) {
  if (!hopper()) GTEST_SKIP() << "FP8 GEMMs need a Hopper GPU";
  const bool flash = GetParam();
  const std::int64_t B = 2, T = 32;
  ops::Fp8LinearOptions o;
  o.recipe = ops::Fp8Recipe::delayed;
  o.history = 4;
  ASSERT_TRUE(model::fp8_swiglu_casts_fused(o));
  ops::Fp8LinearOptions separate = o;
  separate.producer_casts = false;
  ASSERT_FALSE(model::fp8_swiglu_casts_fused(separate));
  for (unsigned seed : {21u, 22u}) {
    const auto tok = tokens(B, T, 101, seed);
    std::vector<std::uint32_t> h_separate, h_fused;
    const auto plain = run(Device::cuda, DType::bf16, true, flash, tok, B, T, separate, &h_separate, 3);
    const auto fused = run(Device::cuda, DType::bf16, true, flash, tok, B, T, o, &h_fused, 3);
    EXPECT_EQ(fused.loss, plain.loss) << "seed " << seed;
    EXPECT_EQ(fused.grads, plain.grads) << "seed " << seed;
    EXPECT_EQ(h_fused, h_separate) << "seed " << seed << ": amax histories or scales differ";
    EXPECT_FALSE(h_fused.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Attention, ModelFp8Cuda, ::testing::Values(false, true),
                         [](const auto& i) { return std::string(i.param ? "flash" : "naive"); });

// A few training steps through the Trainer with delayed scaling (its amax histories advancing on
// the device) against the same steps on the CPU: every step's loss within the bound above.
TEST(ModelFp8CudaTrainer, DelayedScalingStepsMatchTheCpuEmulation) {
  if (!hopper()) GTEST_SKIP() << "FP8 GEMMs need a Hopper GPU";
  comm::MpiEnvironment& mpi = mpi_once();
  auto losses = [&](Device device) {
    Config cfg;
    cfg.model.vocab_size = 101;
    cfg.model.context_length = 32;
    cfg.model.d_model = 64;
    cfg.model.d_ff = 176;
    cfg.model.num_layers = 2;
    cfg.model.num_heads = 4;
    cfg.precision.mode = PrecisionMode::fp8;
    cfg.precision.fp8_scaling = Fp8Scaling::delayed;
    cfg.precision.fp8_history = 4;
    cfg.parallel.device = device == Device::cuda ? DeviceChoice::cuda : DeviceChoice::cpu;
    ops::Runtime rt(device, 0, false);
    io::ResultsFile out("/nonexistent/never.h5", false);
    jobs::JobEnv env{cfg, mpi, rt, out, 0, 1, 0, nullptr, nullptr};
    jobs::Trainer tr(env, 4, 1, 10);
    std::vector<double> l;
    for (int s = 0; s < 5; ++s) l.push_back(tr.train_step(tokens(4, 32, 101, 30 + s), 32).loss);
    return l;
  };
  const auto cpu = losses(Device::cpu), gpu = losses(Device::cuda);
  for (std::size_t s = 0; s < cpu.size(); ++s) {
    std::printf("  step %zu  loss cpu %.6f  gpu %.6f\n", s + 1, cpu[s], gpu[s]);
    EXPECT_NEAR(gpu[s], cpu[s], kLossTol * cpu[s]) << "step " << s + 1;
  }
}
