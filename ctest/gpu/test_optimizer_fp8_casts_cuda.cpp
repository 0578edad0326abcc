// The FP8 weights cast by the optimizer step (ops::Fp8WeightCast, model/fp8_weight_casts.h;
// docs/precision.md, "Weights cast by the optimizer step") against the plain step followed by the
// forward's delayed cast, bit for bit:
// - the ops: AdamW with casts (gradients as one tensor, and as pieces whose boundaries cut through
//   weights) against ops::adamw writing the bf16 working copy and ops::cast_transpose_fp8 of each
//   weight under delayed scaling's history update: the same p, m, v, working copy outside the
//   weights (inside them left unwritten), codes, transposes, scales; after the next begin, the
//   same histories and record slots. 170 weights (more than one launch's table) and weights of
//   several tiles per block. A captured step whose norm is not finite: nothing updated, the
//   unchanged weights cast (as ops::fp8_weight_casts casts them).
// - the Trainer: steps with precision.fp8_weight_casts = optimizer against = forward, eager and
//   with CUDA graphs, an evaluation between steps and the weights replaced mid-run (as a resume
//   does): every loss, the parameters and every FP8 operand's amax history bitwise the same.
// Skipped (exit 77) without a GPU; the FP8 GEMMs of the Trainer test need a Hopper GPU.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lmscale/comm/mpi_environment.h"
#include "lmscale/io/results.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/model/fp8_layers.h"
#include "lmscale/ops/device_step.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/fp8_scaling.h"
#include "lmscale/ops/ops.h"
#include "model_run_util.h"
#include "ops_cuda_test_util.h"

namespace lmscale::test {
namespace {

struct Weight {
  std::int64_t offset, rows, cols;
};

// One delayed scaling state per weight, as the layer's w scaling holds it, and the weight's codes.
struct State {
  Tensor scale, inv, history, work, slot, pending, q, qt;
};

class OptimizerFp8CastsCuda : public CudaOpsTest {
 protected:
  std::vector<std::uint8_t> raw(const Tensor& t) {
    std::vector<std::uint8_t> v(t.nbytes());
    EXPECT_EQ(cudaMemcpy(v.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  // Scale 1, a history of 4 holding amaxes (its scale differs from 1), device record slot 2.
  State state(const Weight& w, double amax) {
    State s;
    s.scale = dev({1.0}, {1}, DType::f32);
    s.inv = dev({1.0}, {1}, DType::f32);
    s.history = dev({amax, 0.25 * amax, 0.0, 0.5 * amax}, {4}, DType::f32);
    s.work = Tensor::empty({2}, DType::i32, gpu_.allocator(), "test_work");
    EXPECT_EQ(cudaMemset(s.work.data(), 0, 8), cudaSuccess);
    s.slot = Tensor::empty({1}, DType::i32, gpu_.allocator(), "test_slot");
    const std::int32_t two = 2;
    EXPECT_EQ(cudaMemcpy(s.slot.data(), &two, 4, cudaMemcpyHostToDevice), cudaSuccess);
    s.pending = dev({123.0}, {1}, DType::f32);   // begin zeroes it
    s.q = poisoned({w.rows, w.cols}, DType::e4m3);
    s.qt = poisoned({w.cols, w.rows}, DType::e4m3);
    return s;
  }
  ops::Fp8HistoryUpdate update(State& s, bool record) {
    return {s.history, record ? 2 : -1, Fp8Format::e4m3, 0, s.inv, s.work, s.slot};
  }
  ops::Fp8WeightCast cast(const Weight& w, State& s) {
    ops::Fp8WeightCast c;
    c.offset = w.offset;
    c.rows = w.rows;
    c.cols = w.cols;
    c.q = s.q;
    c.qt = s.qt;
    c.scale = s.scale;
    c.pending_amax = s.pending;
    c.history = update(s, false);
    return c;
  }
};

// Weights [rows, cols] with gaps of `gap` elements before each and `tail` after the last.
std::vector<Weight> layout(const std::vector<std::pair<std::int64_t, std::int64_t>>& shapes, std::int64_t gap,
                           std::int64_t tail, std::int64_t& n) {
  std::vector<Weight> ws;
  n = 0;
  for (auto [r, c] : shapes) {
    n += gap;
    ws.push_back({n, r, c});
    n += r * c;
  }
  n += tail;
  return ws;
}

TEST_F(OptimizerFp8CastsCuda, StepWithCastsIsTheStepThenTheForwardsCast) {
  std::vector<std::pair<std::int64_t, std::int64_t>> many(170, {64, 64});
  const std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> cases = {
      {{128, 192}, {64, 64}, {320, 256}}, many};
  for (std::size_t k = 0; k < cases.size(); ++k) {
    for (bool pieces : {false, true}) {
      std::int64_t n = 0;
      const std::vector<Weight> ws = layout(cases[k], 136, 24, n);
      const std::string at = "case " + std::to_string(k) + (pieces ? " pieces" : " one gradient");
      const Tensor p0 = dev(randn(static_cast<std::size_t>(n), DType::f32, 0.05), {n}, DType::f32);
      const Tensor grad = dev(randn(static_cast<std::size_t>(n), DType::f32, 1e-3), {n}, DType::f32);
      std::vector<double> vv = randn(static_cast<std::size_t>(n), DType::f32, 1e-6);
      for (double& x : vv) x = x * x;
      const Tensor m0 = dev(randn(static_cast<std::size_t>(n), DType::f32, 1e-4), {n}, DType::f32);
      const Tensor v0 = dev(vv, {n}, DType::f32);
      ops::AdamWStep a;
      a.lr = 3e-3;
      a.step = 7;
      a.grad_scale = 0.5;
      // The plain step and each weight's forward cast (delayed: the scale from the history, then
      // the amax recorded at the device slot).
      Tensor p1 = dev(values(p0), {n}, DType::f32), m1 = dev(values(m0), {n}, DType::f32),
             v1 = dev(values(v0), {n}, DType::f32), low1 = poisoned({n}, DType::bf16);
      ops::adamw(g(), p1, grad, m1, v1, a, &low1);
      std::vector<State> plain;
      for (const Weight& w : ws) {
        plain.push_back(state(w, 0.01 * static_cast<double>(plain.size() + 1)));
        State& s = plain.back();
        ops::Fp8HistoryUpdate u = update(s, true);
        const Tensor lw = low1.flat_range(w.offset, w.rows * w.cols).reshape({w.rows, w.cols});
        ops::cast_transpose_fp8(g(), lw, s.scale, &s.q, &s.qt, &u);
      }
      // The step with the casts.
      Tensor p2 = dev(values(p0), {n}, DType::f32), m2 = dev(values(m0), {n}, DType::f32),
             v2 = dev(values(v0), {n}, DType::f32), low2 = poisoned({n}, DType::bf16);
      std::vector<State> st;
      std::vector<ops::Fp8WeightCast> casts;
      for (const Weight& w : ws) st.push_back(state(w, 0.01 * static_cast<double>(st.size() + 1)));
      for (std::size_t i = 0; i < ws.size(); ++i) casts.push_back(cast(ws[i], st[i]));
      ops::AdamWStep ac = a;
      ac.fp8_casts = &casts;
      ops::fp8_weight_casts_begin(g(), casts, false);
      if (pieces) {
        // Cuts at 1/3 and 2/3 of the buffer (on the 8-element grid): through weights.
        const std::int64_t c1 = n / 3 / 8 * 8, c2 = 2 * n / 3 / 8 * 8;
        std::vector<ops::GradPiece> ps = {{0, grad.flat_range(0, c1)}, {c1, grad.flat_range(c1, c2 - c1)},
                                          {c2, grad.flat_range(c2, n - c2)}};
        ops::adamw_pieces(g(), p2, ps, m2, v2, ac, &low2);
      } else {
        ops::adamw(g(), p2, grad, m2, v2, ac, &low2);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << at;
      EXPECT_EQ(raw(p2), raw(p1)) << at << ": parameters";
      EXPECT_EQ(raw(m2), raw(m1)) << at << ": m";
      EXPECT_EQ(raw(v2), raw(v1)) << at << ": v";
      // The working copy: the plain step's outside the weights, never written inside them.
      const std::vector<std::uint8_t> l1 = raw(low1), l2 = raw(low2);
      std::int64_t at_el = 0, differ = 0, written = 0;
      for (const Weight& w : ws) {
        for (std::int64_t i = at_el; i < w.offset; ++i) differ += std::memcmp(&l1[2 * i], &l2[2 * i], 2) != 0;
        for (std::int64_t i = w.offset; i < w.offset + w.rows * w.cols; ++i)
          written += l2[2 * i] != 0xFF || l2[2 * i + 1] != 0xFF;
        at_el = w.offset + w.rows * w.cols;
      }
      for (std::int64_t i = at_el; i < n; ++i) differ += std::memcmp(&l1[2 * i], &l2[2 * i], 2) != 0;
      EXPECT_EQ(differ, 0) << at << ": working copy outside the weights";
      EXPECT_EQ(written, 0) << at << ": working copy inside the weights";
      for (std::size_t i = 0; i < ws.size(); ++i) {
        const std::string wi = at + ", weight " + std::to_string(i);
        EXPECT_EQ(raw(st[i].q), raw(plain[i].q)) << wi << ": codes";
        EXPECT_EQ(raw(st[i].qt), raw(plain[i].qt)) << wi << ": transposed codes";
        EXPECT_EQ(raw(st[i].scale), raw(plain[i].scale)) << wi << ": scale";
        EXPECT_EQ(raw(st[i].inv), raw(plain[i].inv)) << wi << ": inverse";
      }
      // The next begin records the pending amaxes where the forward casts recorded theirs.
      ops::fp8_weight_casts_begin(g(), casts, true);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << at;
      for (std::size_t i = 0; i < ws.size(); ++i) {
        const std::string wi = at + ", weight " + std::to_string(i);
        EXPECT_EQ(raw(st[i].history), raw(plain[i].history)) << wi << ": history";
        EXPECT_EQ(raw(st[i].slot), raw(plain[i].slot)) << wi << ": record slot";
        EXPECT_EQ(values(st[i].pending)[0], 0.0) << wi << ": pending amax after begin";
      }
    }
  }
}

TEST_F(OptimizerFp8CastsCuda, CapturedStepWithANonFiniteNormCastsTheUnchangedWeights) {
  std::int64_t n = 0;
  const std::vector<Weight> ws = layout({{128, 64}, {64, 192}}, 40, 8, n);
  const Tensor p0 = dev(randn(static_cast<std::size_t>(n), DType::f32, 0.05), {n}, DType::f32);
  const Tensor grad = dev(randn(static_cast<std::size_t>(n), DType::f32, 1e-3), {n}, DType::f32);
  Tensor p = dev(values(p0), {n}, DType::f32), m = dev(std::vector<double>(n, 0.0), {n}, DType::f32),
         v = dev(std::vector<double>(n, 0.0), {n}, DType::f32), low = poisoned({n}, DType::bf16);
  ops::AdamWStep a;
  Tensor scalars = Tensor::empty({ops::kAdamWScalars}, DType::f32, gpu_.allocator(), "test_scalars");
  ops::adamw_upload_scalars(g(), a, scalars);
  const Tensor clip = dev({std::nan(""), 1.0, 0.0}, {ops::kClipSlots}, DType::f64);   // not finite: skip
  a.device_scalars = &scalars;
  a.device_clip = &clip;
  std::vector<State> st, ref;
  std::vector<ops::Fp8WeightCast> casts, ref_casts;
  for (const Weight& w : ws) {
    st.push_back(state(w, 0.02));
    ref.push_back(state(w, 0.02));
  }
  for (std::size_t i = 0; i < ws.size(); ++i) {
    casts.push_back(cast(ws[i], st[i]));
    ref_casts.push_back(cast(ws[i], ref[i]));
  }
  a.fp8_casts = &casts;
  ops::fp8_weight_casts_begin(g(), casts, false);
  ops::adamw(g(), p, grad, m, v, a, &low);
  ops::fp8_weight_casts_begin(g(), ref_casts, false);
  ops::fp8_weight_casts(g(), p0, DType::bf16, ref_casts);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(raw(p), raw(p0)) << "a skipped step changed the parameters";
  EXPECT_EQ(values(m), std::vector<double>(n, 0.0)) << "a skipped step changed m";
  for (std::size_t i = 0; i < ws.size(); ++i) {
    EXPECT_EQ(raw(st[i].q), raw(ref[i].q)) << "weight " << i << ": codes";
    EXPECT_EQ(raw(st[i].qt), raw(ref[i].qt)) << "weight " << i << ": transposed codes";
    EXPECT_EQ(raw(st[i].pending), raw(ref[i].pending)) << "weight " << i << ": pending amax";
    EXPECT_GT(values(st[i].pending)[0], 0.0) << "weight " << i << ": no amax measured";
  }
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<float> params;
  std::vector<float> histories;   // every FP8 operand's history, oldest first
  bool casts_in_step = false;
};

// Six steps (an evaluation after the second, the weights set to their own values after the
// fourth, as a resume sets them) with the weights cast where `site` says.
TrainRun train(Fp8WeightCastSite site, bool graphs) {
  Config cfg;
  cfg.model.vocab_size = 101;
  cfg.model.context_length = 32;
  cfg.model.d_model = 128;
  cfg.model.d_ff = 256;
  cfg.model.num_layers = 2;
  cfg.model.num_heads = 4;
  cfg.precision.mode = PrecisionMode::fp8;
  cfg.precision.fp8_scaling = Fp8Scaling::delayed;
  cfg.precision.fp8_history = 3;
  cfg.precision.fp8_weight_casts = site;
  cfg.train.cuda_graphs = graphs;
  cfg.parallel.device = DeviceChoice::cuda;
  ops::Runtime rt(Device::cuda, 0, false);
  io::ResultsFile out("/nonexistent/never.h5", false);
  jobs::JobEnv env{cfg, mpi_once(), rt, out, 0, 1, 0, nullptr, nullptr};
  jobs::Trainer tr(env, 4, 1, 10);
  TrainRun r;
  r.casts_in_step = tr.model().fp8_weight_casts() != nullptr;
  for (int s = 0; s < 6; ++s) {
    r.losses.push_back(tr.train_step(tokens(4, 32, 101, 40 + s), 32).loss);
    if (s == 1) r.losses.push_back(tr.forward_loss(tokens(4, 32, 101, 99), 32));
    if (s == 3) tr.set_parameters(tr.full_parameters());
  }
  r.params = tr.full_parameters();
  model::TransformerLM& m = tr.model();
  for (int l = 0; l < 2; ++l)
    for (const model::Fp8Gemm gm : model::kFp8BlockGemms) {
      const ops::Fp8Linear& lin = m.fp8()->at(l, gm);
      for (const ops::Fp8TensorScaling* s : {&lin.x_scaling(), &lin.w_scaling(), &lin.dy_scaling()})
        for (float h : s->history_oldest_first(rt.ctx())) r.histories.push_back(h);
    }
  return r;
}

TEST(OptimizerFp8CastsTrainer, StepsAreBitwiseThoseOfTheForwardsCasts) {
  if (!has_fp8_gemm()) GTEST_SKIP() << "FP8 GEMMs need a Hopper GPU";
  for (bool graphs : {false, true}) {
    const TrainRun fwd = train(Fp8WeightCastSite::forward, graphs), opt = train(Fp8WeightCastSite::optimizer, graphs);
    const std::string at = graphs ? "with CUDA graphs" : "eager";
    EXPECT_FALSE(fwd.casts_in_step) << at;
    EXPECT_TRUE(opt.casts_in_step) << at << ": the step does not cast the weights";
    EXPECT_EQ(opt.losses, fwd.losses) << at;
    EXPECT_EQ(opt.params, fwd.params) << at;
    EXPECT_EQ(opt.histories, fwd.histories) << at;
    for (std::size_t i = 0; i < opt.losses.size(); ++i) std::printf("  %s loss %zu  %.9f\n", at.c_str(), i, opt.losses[i]);
  }
}

}  // namespace
}  // namespace lmscale::test
