// The model's CUDA ops and their backward against the float64 CPU reference (public ops:: API with
// CPU tensors), on fresh random inputs, outputs poisoned with NaN, in fp32, bf16 and fp16, with
// sizes that are and are not multiples of the 16-byte vector width. Bounds: ops_cuda_test_util.h.
#include <cuda_runtime.h>

#include <cstdlib>
#include <set>
#include <tuple>

#include "../../src/ops/cuda/resources.h"
#include "lmscale/core/error.h"
#include "ops_cuda_test_util.h"

namespace lmscale::test {
namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

// ---- linear ----------------------------------------------------------------------------------
struct LinearCase {
  std::int64_t M, K, N;
};
const LinearCase kLinear[] = {{64, 128, 96}, {37, 61, 45}, {3, 8, 1}, {256, 384, 512}};

class LinearTest : public CudaOpsTest {
 protected:
  void run(DType t, bool tf32, DType dw_type, bool accumulate) {
    g().allow_tf32 = tf32;
    const double tol = tf32 ? 2e-3 : tolerance(t);
    for (const auto& [M, K, N] : kLinear) {
      SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K << " N=" << N << " " << dtype_name(t)
                                        << (tf32 ? " tf32" : "") << " dw " << dtype_name(dw_type));
      const auto x = randn(M * K, t), w = randn(N * K, t, 0.1), dy = randn(M * N, t), dw0 = randn(N * K, dw_type);
      // forward
      Tensor y = poisoned({M, N}, t);
      ops::linear(g(), dev(x, {M, K}, t), dev(w, {N, K}, t), y);
      Tensor yr = ref(std::vector<double>(M * N), {M, N});
      ops::linear(c(), ref(x, {M, K}), ref(w, {N, K}), yr);
      EXPECT_CLOSE(values(y), values(yr), tol);
      // backward: dx overwritten, dw accumulated or overwritten (fp32 dw from 16-bit inputs)
      Tensor dx = poisoned({M, K}, t);
      Tensor dw = accumulate ? dev(dw0, {N, K}, dw_type) : poisoned({N, K}, dw_type);
      ops::linear_backward(g(), dev(x, {M, K}, t), dev(w, {N, K}, t), dev(dy, {M, N}, t), &dx, &dw, accumulate);
      Tensor dxr = ref(std::vector<double>(M * K), {M, K});
      Tensor dwr = ref(accumulate ? dw0 : std::vector<double>(N * K), {N, K});
      ops::linear_backward(c(), ref(x, {M, K}), ref(w, {N, K}), ref(dy, {M, N}), &dxr, &dwr, accumulate);
      EXPECT_CLOSE(values(dx), values(dxr), tol);
      EXPECT_CLOSE(values(dw), values(dwr), tf32 ? 2e-3 : tolerance(dw_type));
    }
  }
};

TEST_F(LinearTest, Fp32NoTf32) { run(DType::f32, false, DType::f32, false); }
TEST_F(LinearTest, Fp32Tf32) { run(DType::f32, true, DType::f32, true); }
TEST_F(LinearTest, Bf16) { run(DType::bf16, false, DType::bf16, false); }
TEST_F(LinearTest, Fp16) { run(DType::f16, false, DType::f16, true); }
TEST_F(LinearTest, Bf16InputsFp32MasterGradAccumulates) { run(DType::bf16, false, DType::f32, true); }
TEST_F(LinearTest, Fp16InputsFp32MasterGrad) { run(DType::f16, false, DType::f32, false); }

// Without TF32 an fp32 GEMM is exact to fp32 rounding: its error must be far below TF32's, which
// shows the compute mode really is fp32 (a TF32 product at K=1024 errs by ~3e-4).
TEST_F(LinearTest, Fp32IsNotSilentlyTf32) {
  const std::int64_t M = 128, K = 1024, N = 128;
  const auto x = randn(M * K), w = randn(N * K);
  Tensor yr = ref(std::vector<double>(M * N), {M, N});
  ops::linear(c(), ref(x, {M, K}), ref(w, {N, K}), yr);
  Tensor y = poisoned({M, N}, DType::f32);
  g().allow_tf32 = false;
  ops::linear(g(), dev(x, {M, K}, DType::f32), dev(w, {N, K}, DType::f32), y);
  const double err32 = rel_error(values(y), values(yr));
  g().allow_tf32 = true;
  poison(y);
  ops::linear(g(), dev(x, {M, K}, DType::f32), dev(w, {N, K}, DType::f32), y);
  const double err_tf32 = rel_error(values(y), values(yr));
  EXPECT_LT(err32, 1e-6);
  EXPECT_GT(err_tf32, 10 * err32) << "TF32 allowed should change the numbers";
  EXPECT_LT(err_tf32, 2e-3);
}

// A view at an odd element offset (4-byte aligned only) still multiplies correctly.
TEST_F(LinearTest, UnalignedViews) {
  const std::int64_t M = 33, K = 40, N = 24;
  const auto x = randn(M * K + 1), w = randn(N * K, DType::f64, 0.1);
  Tensor xd = dev(x, {M * K + 1}, DType::f32).flat_range(1, M * K).reshape({M, K});
  Tensor y = poisoned({M, N}, DType::f32);
  ops::linear(g(), xd, dev(w, {N, K}, DType::f32), y);
  Tensor yr = ref(std::vector<double>(M * N), {M, N});
  ops::linear(c(), ref(std::vector<double>(x.begin() + 1, x.end()), {M, K}), ref(w, {N, K}), yr);
  EXPECT_CLOSE(values(y), values(yr), 1e-5);
}

// With LMSCALE_GEMM_AUTOTUNE=1 each new shape times several cuBLASLt algorithms into a scratch
// output: the result must be the same product, and an accumulating dw must be accumulated once.
TEST_F(LinearTest, AutotunedAlgorithmsGiveTheSameProduct) {
  setenv("LMSCALE_GEMM_AUTOTUNE", "1", 1);
  ops::Runtime tuned(Device::cuda, 0, false);
  unsetenv("LMSCALE_GEMM_AUTOTUNE");
  for (DType t : {DType::f32, DType::bf16}) {
    const std::int64_t M = 256, K = 320, N = 192;
    const auto x = randn(M * K, t), w = randn(N * K, t, 0.1), dy = randn(M * N, t), dw0 = randn(N * K);
    Tensor xd = dev(x, {M, K}, t), wd = dev(w, {N, K}, t), dyd = dev(dy, {M, N}, t), dw = dev(dw0, {N, K}, DType::f32);
    Tensor y = poisoned({M, N}, t), dx = poisoned({M, K}, t);
    gpu_.synchronize();   // inputs were written on the other runtime's stream
    ops::linear(tuned.ctx(), xd, wd, y);
    ops::linear_backward(tuned.ctx(), xd, wd, dyd, &dx, &dw, true);
    tuned.synchronize();
    Tensor yr = ref(std::vector<double>(M * N), {M, N}), dxr = ref(std::vector<double>(M * K), {M, K});
    Tensor dwr = ref(dw0, {N, K});
    ops::linear(c(), ref(x, {M, K}), ref(w, {N, K}), yr);
    ops::linear_backward(c(), ref(x, {M, K}), ref(w, {N, K}), ref(dy, {M, N}), &dxr, &dwr, true);
    EXPECT_CLOSE(values(y), values(yr), tolerance(t));
    EXPECT_CLOSE(values(dx), values(dxr), tolerance(t));
    EXPECT_CLOSE(values(dw), values(dwr), 1e-5);
  }
}

// parallel.comm_sms: inside a carve-out the GEMM plans target the SMs NCCL leaves (a separate
// plan per target); the products stay the same products. Scopes nest, an inner one that is off
// keeps the outer target, and more than half the SMs is refused naming the key.
TEST_F(LinearTest, CarvedOutPlansGiveTheSameProduct) {
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  ops::Runtime rt(Device::cuda, 0, false);
  EXPECT_THROW(rt.set_comm_sms(sms / 2 + 1), UsageError);
  rt.set_comm_sms(16);
  EXPECT_EQ(rt.gemm_sm_target(), 0);
  for (DType t : {DType::bf16, DType::f32}) {
    const std::int64_t M = 1024, K = 640, N = 768;   // 48 tiles of 128 x 128: more than one wave on 16 SMs less
    const auto x = randn(M * K, t), w = randn(N * K, t, 0.1), dy = randn(M * N, t);
    Tensor xd = dev(x, {M, K}, t), wd = dev(w, {N, K}, t), dyd = dev(dy, {M, N}, t);
    gpu_.synchronize();   // inputs were written on the other runtime's stream
    Tensor y_all = poisoned({M, N}, t), y_carved = poisoned({M, N}, t), dx = poisoned({M, K}, t);
    Tensor dw = poisoned({N, K}, DType::f32);
    ops::linear(rt.ctx(), xd, wd, y_all);
    {
      ops::Runtime::GemmCarveout carve(rt, true);
      EXPECT_EQ(rt.gemm_sm_target(), sms - 16);
      {
        ops::Runtime::GemmCarveout inner(rt, false);
        EXPECT_EQ(rt.gemm_sm_target(), sms - 16);
      }
      ops::linear(rt.ctx(), xd, wd, y_carved);
      ops::linear_backward(rt.ctx(), xd, wd, dyd, &dx, &dw, false);
    }
    EXPECT_EQ(rt.gemm_sm_target(), 0);
    rt.synchronize();
    Tensor yr = ref(std::vector<double>(M * N), {M, N}), dxr = ref(std::vector<double>(M * K), {M, K});
    Tensor dwr = ref(std::vector<double>(N * K), {N, K});
    ops::linear(c(), ref(x, {M, K}), ref(w, {N, K}), yr);
    ops::linear_backward(c(), ref(x, {M, K}), ref(w, {N, K}), ref(dy, {M, N}), &dxr, &dwr, false);
    EXPECT_CLOSE(values(y_all), values(yr), tolerance(t));
    EXPECT_CLOSE(values(y_carved), values(yr), tolerance(t));
    EXPECT_CLOSE(values(dx), values(dxr), tolerance(t));
    EXPECT_CLOSE(values(dw), values(dwr), 1e-5);
  }
}

// ---- GEMM shape classes (an MoE expert's rows change every step; gemm.h) -----------------------
// Many random row counts through one linear's forward, dx and accumulating dW: past the first
// kExactShapesBeforeClassPlan shapes of a class the products run on the class's plan (layouts
// set to the exact dims), and must equal the float64 CPU reference within the usual bounds; the
// plan cache must stay within kExactPlansPerClass + 1 plans per class (the exact-key cache made
// one plan per row count: ~3 per call here). K and N are neither powers of two nor multiples of
// 256, so the representatives' leading dimensions are grown too.
TEST_F(LinearTest, VaryingRowsShareShapeClassPlans) {
  auto& cache = ops::cuda::resources(g()).gemm_plans;
  for (DType t : {DType::bf16, DType::f32}) {
    const std::int64_t K = 200, N = 136;
    const auto w = randn(N * K, t, 0.1), dw0 = randn(N * K);
    Tensor wd = dev(w, {N, K}, t);
    Tensor dw = dev(dw0, {N, K}, DType::f32), dwr = ref(dw0, {N, K});
    const std::size_t plans_before = cache.size();
    const std::int64_t products_before = cache.class_products;
    std::set<std::int64_t> classes, distinct;   // of M
    const auto rows = randint(120, 200, 1100);
    for (const std::int32_t M : rows) {
      SCOPED_TRACE(::testing::Message() << "M=" << M << " " << dtype_name(t));
      classes.insert(ops::cuda::shape_class_dim(M));
      distinct.insert(M);
      const auto x = randn(M * K, t), dy = randn(M * N, t);
      Tensor xd = dev(x, {M, K}, t), y = poisoned({M, N}, t), dx = poisoned({M, K}, t);
      ops::linear(g(), xd, wd, y);
      ops::linear_backward(g(), xd, wd, dev(dy, {M, N}, t), &dx, &dw, true);
      Tensor yr = ref(std::vector<double>(M * N), {M, N}), dxr = ref(std::vector<double>(M * K), {M, K});
      ops::linear(c(), ref(x, {M, K}), ref(w, {N, K}), yr);
      ops::linear_backward(c(), ref(x, {M, K}), ref(w, {N, K}), ref(dy, {M, N}), &dxr, &dwr, true);
      EXPECT_CLOSE(values(y), values(yr), tolerance(t));
      EXPECT_CLOSE(values(dx), values(dxr), tolerance(t));
    }
    EXPECT_CLOSE(values(dw), values(dwr), 1e-5);   // 120 accumulated products, fp32 master gradient
    // Three product kinds (forward, dx, dW), each in the classes of its varying dimension M.
    const std::size_t bound = 3 * classes.size() * (ops::cuda::kExactPlansPerClass + 1);
    EXPECT_LE(cache.size() - plans_before, bound);
    EXPECT_LT(cache.size() - plans_before, distinct.size()) << "the cache grows per row count";
    EXPECT_GT(cache.class_products - products_before, 0) << "no product ran on a shape class plan";
  }
}

// ---- linear_group (q, k, v and w1, w3 of a block) ---------------------------------------------
// n weights [N,K] `gap` weights apart in one buffer (gap 1: back to back like q, k, v or w1, w3;
// gap 2: equally spaced with a weight between; gap 8: an expert's w1 and w3 in stacked [8, N, K]
// weights, docs/moe.md), outputs and their gradients views of one [n,M,N] tensor (the
// strided-batched GEMM) or separate tensors (one product each); weight gradients likewise in one
// buffer or separate. Checked against the float64 CPU reference of separate linear products.
class LinearGroupTest : public CudaOpsTest {
 protected:
  void run(DType t, DType dw_type, int n, int gap, bool packed, bool accumulate) {
    const std::int64_t M = 77, K = 96, N = 40;
    SCOPED_TRACE(::testing::Message() << dtype_name(t) << " dw " << dtype_name(dw_type) << " n=" << n << " gap=" << gap
                                      << (packed ? " packed" : " separate") << (accumulate ? " accumulate" : ""));
    const auto x = randn(M * K, t), wall = randn(n * gap * N * K, t, 0.1), dyall = randn(n * M * N, t),
               dwall = randn(n * gap * N * K, dw_type);
    Tensor xd = dev(x, {M, K}, t), wd = dev(wall, {n * gap * N * K}, t), dyd = dev(dyall, {n * M * N}, t);
    Tensor dwd = dev(dwall, {n * gap * N * K}, dw_type), yd = poisoned({n * M * N}, t);
    std::vector<Tensor> ws, ys, dys, dws;
    for (int i = 0; i < n; ++i) {
      ws.push_back(wd.flat_range(i * gap * N * K, N * K).reshape({N, K}));
      dws.push_back(packed ? dwd.flat_range(i * gap * N * K, N * K).reshape({N, K})
                           : dev(std::vector<double>(dwall.begin() + i * gap * N * K,
                                                     dwall.begin() + (i * gap + 1) * N * K), {N, K}, dw_type));
      ys.push_back(packed ? yd.flat_range(i * M * N, M * N).reshape({M, N}) : poisoned({M, N}, t));
      dys.push_back(packed ? dyd.flat_range(i * M * N, M * N).reshape({M, N})
                           : dev(std::vector<double>(dyall.begin() + i * M * N, dyall.begin() + (i + 1) * M * N),
                                 {M, N}, t));
    }
    Tensor dx = poisoned({M, K}, t);
    ops::linear_group(g(), xd, ws, ys);
    ops::linear_group_backward(g(), xd, ws, dys, &dx, &dws, accumulate);
    std::vector<double> dxr(M * K, 0.0);
    for (int i = 0; i < n; ++i) {
      const std::vector<double> wi(wall.begin() + i * gap * N * K, wall.begin() + (i * gap + 1) * N * K),
          dyi(dyall.begin() + i * M * N, dyall.begin() + (i + 1) * M * N),
          dw0(dwall.begin() + i * gap * N * K, dwall.begin() + (i * gap + 1) * N * K);
      Tensor yr = ref(std::vector<double>(M * N), {M, N}), dxi = ref(std::vector<double>(M * K), {M, K});
      Tensor dwr = ref(accumulate ? dw0 : std::vector<double>(N * K), {N, K});
      ops::linear(c(), ref(x, {M, K}), ref(wi, {N, K}), yr);
      ops::linear_backward(c(), ref(x, {M, K}), ref(wi, {N, K}), ref(dyi, {M, N}), &dxi, &dwr, accumulate);
      EXPECT_CLOSE(values(ys[i]), values(yr), tolerance(t));
      EXPECT_CLOSE(values(dws[i]), values(dwr), tolerance(dw_type));
      const auto v = values(dxi);
      for (std::int64_t j = 0; j < M * K; ++j) dxr[j] += v[j];
    }
    EXPECT_CLOSE(values(dx), dxr, tolerance(t));
    if (packed && gap > 1) {   // the weights between the group's are not written
      const auto all = values(dwd);
      for (std::int64_t j = N * K; j < gap * N * K; ++j) ASSERT_EQ(all[j], round_to(dwall[j], dw_type)) << j;
    }
  }
};

TEST_F(LinearGroupTest, QkvPackedBf16Fp32Grads) { run(DType::bf16, DType::f32, 3, 1, true, true); }
TEST_F(LinearGroupTest, QkvPackedFp32) { run(DType::f32, DType::f32, 3, 1, true, false); }
TEST_F(LinearGroupTest, W13PackedWithGapFp16) { run(DType::f16, DType::f32, 2, 2, true, false); }
TEST_F(LinearGroupTest, W13PackedWithGapBf16Accumulates) { run(DType::bf16, DType::f32, 2, 2, true, true); }
TEST_F(LinearGroupTest, ExpertMatricesEightApartBf16Accumulates) { run(DType::bf16, DType::f32, 2, 8, true, true); }
TEST_F(LinearGroupTest, SeparateTensorsOneProductEach) { run(DType::bf16, DType::f32, 3, 1, false, true); }

// ---- linear_side_by_side (the fused q|k|v and w1|w3 projections) --------------------------------
// n weights [R,K] `gap` weights apart in one buffer (gap 1: back to back like q, k, v or w1, w3:
// one GEMM each way; gap 2: equally spaced, the strided batch over column blocks) or separate
// tensors (one product each); y and dy [M, n*R] side by side; weight gradients in one buffer (same
// gap) or separate. Checked against the float64 CPU reference of separate linear products.
class LinearSideBySideTest : public CudaOpsTest {
 protected:
  void run(DType t, DType dw_type, int n, int gap, bool packed, bool accumulate) {
    const std::int64_t M = 77, K = 96, R = 40, C = n * R;
    SCOPED_TRACE(::testing::Message() << dtype_name(t) << " dw " << dtype_name(dw_type) << " n=" << n << " gap=" << gap
                                      << (packed ? " packed" : " separate") << (accumulate ? " accumulate" : ""));
    const auto x = randn(M * K, t), wall = randn(n * gap * R * K, t, 0.1), dy = randn(M * C, t),
               dwall = randn(n * gap * R * K, dw_type);
    Tensor xd = dev(x, {M, K}, t), wd = dev(wall, {n * gap * R * K}, t), dwd = dev(dwall, {n * gap * R * K}, dw_type);
    std::vector<Tensor> ws, dws;
    for (int i = 0; i < n; ++i) {
      const auto w0 = wall.begin() + i * gap * R * K, g0 = dwall.begin() + i * gap * R * K;
      ws.push_back(packed ? wd.flat_range(i * gap * R * K, R * K).reshape({R, K})
                          : dev(std::vector<double>(w0, w0 + R * K), {R, K}, t));
      dws.push_back(packed ? dwd.flat_range(i * gap * R * K, R * K).reshape({R, K})
                           : dev(std::vector<double>(g0, g0 + R * K), {R, K}, dw_type));
    }
    Tensor y = poisoned({M, C}, t), dx = poisoned({M, K}, t);
    ops::linear_side_by_side(g(), xd, ws, y);
    ops::linear_side_by_side_backward(g(), xd, ws, dev(dy, {M, C}, t), &dx, &dws, accumulate);
    const auto yv = values(y);
    std::vector<double> dxr(M * K, 0.0);
    for (int i = 0; i < n; ++i) {
      const std::vector<double> wi(wall.begin() + i * gap * R * K, wall.begin() + (i * gap + 1) * R * K),
          dw0(dwall.begin() + i * gap * R * K, dwall.begin() + (i * gap + 1) * R * K);
      std::vector<double> dyi(M * R), yi(M * R);
      for (std::int64_t r = 0; r < M; ++r)
        for (std::int64_t j = 0; j < R; ++j) {
          dyi[r * R + j] = dy[r * C + i * R + j];
          yi[r * R + j] = yv[r * C + i * R + j];
        }
      Tensor yr = ref(std::vector<double>(M * R), {M, R}), dxi = ref(std::vector<double>(M * K), {M, K});
      Tensor dwr = ref(accumulate ? dw0 : std::vector<double>(R * K), {R, K});
      ops::linear(c(), ref(x, {M, K}), ref(wi, {R, K}), yr);
      ops::linear_backward(c(), ref(x, {M, K}), ref(wi, {R, K}), ref(dyi, {M, R}), &dxi, &dwr, accumulate);
      EXPECT_CLOSE(yi, values(yr), tolerance(t));
      EXPECT_CLOSE(values(dws[i]), values(dwr), tolerance(dw_type));
      const auto v = values(dxi);
      for (std::int64_t j = 0; j < M * K; ++j) dxr[j] += v[j];
    }
    EXPECT_CLOSE(values(dx), dxr, tolerance(t));
    if (packed && gap > 1) {   // the weights between the group's are not written
      const auto all = values(dwd);
      for (std::int64_t j = R * K; j < gap * R * K; ++j) ASSERT_EQ(all[j], round_to(dwall[j], dw_type)) << j;
    }
  }
};

TEST_F(LinearSideBySideTest, QkvBackToBackBf16Fp32Grads) { run(DType::bf16, DType::f32, 3, 1, true, true); }
TEST_F(LinearSideBySideTest, QkvBackToBackFp32) { run(DType::f32, DType::f32, 3, 1, true, false); }
TEST_F(LinearSideBySideTest, W13WithGapFp16) { run(DType::f16, DType::f32, 2, 2, true, false); }
TEST_F(LinearSideBySideTest, W13WithGapBf16Accumulates) { run(DType::bf16, DType::f32, 2, 2, true, true); }
TEST_F(LinearSideBySideTest, SeparateTensorsOneProductEach) { run(DType::bf16, DType::f32, 3, 1, false, true); }

// ---- RMSNorm -----------------------------------------------------------------------------------
class RmsNormTest : public CudaOpsTest,
                    public ::testing::WithParamInterface<std::tuple<DType, bool, std::int64_t>> {};

TEST_P(RmsNormTest, ForwardBackward) {
  const auto [t, fp32_weight, d] = GetParam();
  const DType wt = fp32_weight ? DType::f32 : t;
  const std::int64_t N = 67;
  const auto x = randn(N * d, t), dy = randn(N * d, t), dw0 = randn(d, wt);
  auto w = randn(d, DType::f64, 0.5);
  for (auto& v : w) v = round_to(1.0 + v, wt);   // norm weights near 1, as trained ones are
  Tensor y = poisoned({N, d}, t), rstd = poisoned({N}, DType::f32);
  ops::rmsnorm(g(), dev(x, {N, d}, t), dev(w, {d}, wt), 1e-5, y, rstd);
  Tensor yr = ref(std::vector<double>(N * d), {N, d}), rr = ref(std::vector<double>(N), {N});
  ops::rmsnorm(c(), ref(x, {N, d}), ref(w, {d}), 1e-5, yr, rr);
  EXPECT_CLOSE(values(y), values(yr), tolerance(t));
  EXPECT_CLOSE(values(rstd), values(rr), 1e-5);

  Tensor dx = poisoned({N, d}, t), dw = dev(dw0, {d}, wt);
  ops::rmsnorm_backward(g(), dev(x, {N, d}, t), dev(w, {d}, wt), rstd, dev(dy, {N, d}, t), dx, dw);
  Tensor dxr = ref(std::vector<double>(N * d), {N, d}), dwr = ref(dw0, {d});
  ops::rmsnorm_backward(c(), ref(x, {N, d}), ref(w, {d}), rr, ref(dy, {N, d}), dxr, dwr);
  EXPECT_CLOSE(values(dx), values(dxr), tolerance(t));
  // dw sums N rows in fp32 from the GPU's rstd (fp32), then one rounding to wt.
  EXPECT_CLOSE(values(dw), values(dwr), tolerance(wt) * (wt == DType::f32 ? 3 : 1));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RmsNormTest,
                         ::testing::Combine(::testing::ValuesIn(kTypes), ::testing::Bool(),
                                            ::testing::Values<std::int64_t>(1600, 37, 8, 8200)));

// The fused residual add + norm is bitwise ops::add then ops::rmsnorm on the GPU (sum, y, rstd);
// the accumulating backward adds to what dx held (against the float64 reference: dx0 + dx).
TEST_P(RmsNormTest, FusedAddAndAccumulatingBackward) {
  const auto [t, fp32_weight, d] = GetParam();
  const DType wt = fp32_weight ? DType::f32 : t;
  const std::int64_t N = 67;
  const auto a = randn(N * d, t), b = randn(N * d, t), dy = randn(N * d, t), dx0 = randn(N * d, t);
  auto w = randn(d, DType::f64, 0.5);
  for (auto& v : w) v = round_to(1.0 + v, wt);
  Tensor ad = dev(a, {N, d}, t), bd = dev(b, {N, d}, t), wd = dev(w, {d}, wt);
  Tensor sum = poisoned({N, d}, t), y = poisoned({N, d}, t), rstd = poisoned({N}, DType::f32);
  ops::add_rmsnorm(g(), ad, bd, wd, 1e-5, sum, y, rstd);
  Tensor sum2 = poisoned({N, d}, t), y2 = poisoned({N, d}, t), rstd2 = poisoned({N}, DType::f32);
  ops::add(g(), ad, bd, sum2);
  ops::rmsnorm(g(), sum2, wd, 1e-5, y2, rstd2);
  EXPECT_EQ(values(sum), values(sum2));
  EXPECT_EQ(values(y), values(y2));
  EXPECT_EQ(values(rstd), values(rstd2));

  Tensor dx = dev(dx0, {N, d}, t), dw = dev(std::vector<double>(d, 0.0), {d}, wt);
  ops::rmsnorm_backward(g(), sum, wd, rstd, dev(dy, {N, d}, t), dx, dw, true);
  const auto sv = values(sum);
  Tensor dxr = ref(std::vector<double>(N * d), {N, d}), dwr = ref(std::vector<double>(d, 0.0), {d});
  Tensor rr = ref(std::vector<double>(N), {N}), yr = ref(std::vector<double>(N * d), {N, d});
  ops::rmsnorm(c(), ref(sv, {N, d}), ref(w, {d}), 1e-5, yr, rr);
  ops::rmsnorm_backward(c(), ref(sv, {N, d}), ref(w, {d}), rr, ref(dy, {N, d}), dxr, dwr);
  auto want = values(dxr);
  for (std::int64_t i = 0; i < N * d; ++i) want[static_cast<std::size_t>(i)] += round_to(dx0[static_cast<std::size_t>(i)], t);
  EXPECT_CLOSE(values(dx), want, tolerance(t));
}

// ---- RoPE --------------------------------------------------------------------------------------
TEST_F(CudaOpsTest, RopeForwardAndInverse) {
  struct Case {
    std::int64_t B, T, H, Dh;
  };
  for (DType t : kTypes)
    for (const auto& [B, T, H, Dh] : {Case{2, 300, 3, 64}, Case{1, 17, 2, 6}, Case{3, 1024, 1, 8}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " B=" << B << " T=" << T << " H=" << H << " Dh=" << Dh);
      const std::int64_t n = B * T * H * Dh;
      const auto x = randn(n, t);
      for (bool inverse : {false, true}) {
        Tensor xd = dev(x, {B, T, H, Dh}, t);
        ops::rope(g(), xd, B, T, H, Dh, 10000.0, inverse);
        Tensor xr = ref(x, {B, T, H, Dh});
        ops::rope(c(), xr, B, T, H, Dh, 10000.0, inverse);
        EXPECT_CLOSE(values(xd), values(xr), tolerance(t));
      }
    }
}

// q|k|v rows [B*T, 3*H*Dh]: RoPE on the first 2H heads of each row (row stride 3*H*Dh), against
// the CPU op on the same layout; v's columns must come back unchanged (the whole buffer is compared).
TEST_F(CudaOpsTest, RopeWithRowStride) {
  struct Case {
    std::int64_t B, T, H, Dh;
  };
  for (DType t : kTypes)
    for (const auto& [B, T, H, Dh] : {Case{2, 300, 3, 64}, Case{1, 17, 2, 6}}) {   // vector and scalar paths
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " B=" << B << " T=" << T << " H=" << H << " Dh=" << Dh);
      const std::int64_t dl = H * Dh, n = B * T * 3 * dl;
      const auto x = randn(n, t);
      for (bool inverse : {false, true}) {
        Tensor xd = dev(x, {B * T, 3 * dl}, t);
        Tensor qk = xd.flat_range(0, (B * T - 1) * 3 * dl + 2 * dl);
        ops::rope(g(), qk, B, T, 2 * H, Dh, 10000.0, inverse, 3 * dl);
        Tensor xr = ref(x, {B * T, 3 * dl});
        Tensor qkr = xr.flat_range(0, (B * T - 1) * 3 * dl + 2 * dl);
        ops::rope(c(), qkr, B, T, 2 * H, Dh, 10000.0, inverse, 3 * dl);
        EXPECT_CLOSE(values(xd), values(xr), tolerance(t));
      }
    }
}

// ---- SwiGLU ------------------------------------------------------------------------------------
TEST_F(CudaOpsTest, SwigluForwardBackward) {
  for (DType t : kTypes)
    for (std::int64_t n : {std::int64_t{4096 * 3}, std::int64_t{1001}, std::int64_t{5}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " n=" << n);
      const auto a = randn(n, t, 2.0), b = randn(n, t), dh = randn(n, t);
      Tensor h = poisoned({n}, t);
      ops::swiglu(g(), dev(a, {n}, t), dev(b, {n}, t), h);
      Tensor hr = ref(std::vector<double>(n), {n});
      ops::swiglu(c(), ref(a, {n}), ref(b, {n}), hr);
      EXPECT_CLOSE(values(h), values(hr), tolerance(t));
      Tensor da = poisoned({n}, t), db = poisoned({n}, t);
      ops::swiglu_backward(g(), dev(a, {n}, t), dev(b, {n}, t), dev(dh, {n}, t), da, db);
      Tensor dar = ref(std::vector<double>(n), {n}), dbr = ref(std::vector<double>(n), {n});
      ops::swiglu_backward(c(), ref(a, {n}), ref(b, {n}), ref(dh, {n}), dar, dbr);
      EXPECT_CLOSE(values(da), values(dar), tolerance(t));
      EXPECT_CLOSE(values(db), values(dbr), tolerance(t));
    }
}

// a|b rows [N, 2F] (the model's FFN layout): swiglu_rows and its backward against the CPU op on
// the same layout. F = 40 takes the 16-byte path, F = 5 the scalar one; da|db are written into a
// poisoned [N, 2F] buffer, all of whose elements must come back written.
TEST_F(CudaOpsTest, SwigluRowsForwardBackward) {
  for (DType t : kTypes)
    for (std::int64_t F : {std::int64_t{40}, std::int64_t{5}}) {
      const std::int64_t N = 33;
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " N=" << N << " F=" << F);
      const auto ab = randn(N * 2 * F, t, 2.0), dh = randn(N * F, t);
      const std::int64_t span = (N - 1) * 2 * F + F;
      Tensor abd = dev(ab, {N, 2 * F}, t), abr = ref(ab, {N, 2 * F});
      Tensor h = poisoned({N, F}, t), hr = ref(std::vector<double>(N * F), {N, F});
      ops::swiglu_rows(g(), abd.flat_range(0, span), abd.flat_range(F, span), N, F, 2 * F, h);
      ops::swiglu_rows(c(), abr.flat_range(0, span), abr.flat_range(F, span), N, F, 2 * F, hr);
      EXPECT_CLOSE(values(h), values(hr), tolerance(t));
      Tensor dab = poisoned({N, 2 * F}, t), dabr = ref(std::vector<double>(N * 2 * F), {N, 2 * F});
      Tensor da = dab.flat_range(0, span), db = dab.flat_range(F, span);
      Tensor dar = dabr.flat_range(0, span), dbr = dabr.flat_range(F, span);
      ops::swiglu_rows_backward(g(), abd.flat_range(0, span), abd.flat_range(F, span), N, F, 2 * F, dev(dh, {N, F}, t),
                                da, db);
      ops::swiglu_rows_backward(c(), abr.flat_range(0, span), abr.flat_range(F, span), N, F, 2 * F, ref(dh, {N, F}),
                                dar, dbr);
      EXPECT_CLOSE(values(dab), values(dabr), tolerance(t));
    }
}

// ---- embedding ---------------------------------------------------------------------------------
TEST_F(CudaOpsTest, EmbeddingForwardBackward) {
  struct Case {
    std::int64_t V, d, N;
  };
  for (DType t : kTypes)
    for (DType grad_t : {t, DType::f32})
      for (const auto& [V, d, N] : {Case{1000, 64, 512}, Case{7, 13, 300}, Case{50, 1600, 64}}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " grad " << dtype_name(grad_t) << " V=" << V
                                          << " d=" << d << " N=" << N);
        const auto table = randn(V * d, t), dout = randn(N * d, t), dt0 = randn(V * d, grad_t);
        const auto ids = randint(N, 0, static_cast<std::int32_t>(V));
        Tensor out = poisoned({N, d}, t);
        ops::embedding(g(), dev_ids(ids, {N}), dev(table, {V, d}, t), out);
        Tensor outr = ref(std::vector<double>(N * d), {N, d});
        ops::embedding(c(), host_ids(ids, {N}), ref(table, {V, d}), outr);
        EXPECT_CLOSE(values(out), values(outr), tolerance(t));

        Tensor dt = dev(dt0, {V, d}, grad_t);
        ops::embedding_backward(g(), dev_ids(ids, {N}), dev(dout, {N, d}, t), dt);
        Tensor dtr = ref(dt0, {V, d});
        ops::embedding_backward(c(), host_ids(ids, {N}), ref(dout, {N, d}), dtr);
        EXPECT_CLOSE(values(dt), values(dtr), tolerance(grad_t));
        // Deterministic: the same inputs give the same bits.
        Tensor dt2 = dev(dt0, {V, d}, grad_t);
        ops::embedding_backward(g(), dev_ids(ids, {N}), dev(dout, {N, d}, t), dt2);
        EXPECT_EQ(values(dt), values(dt2));
      }
}

// ---- cross-entropy -----------------------------------------------------------------------------
TEST_F(CudaOpsTest, CrossEntropyFusedGradient) {
  struct Case {
    std::int64_t N, V;
  };
  for (DType t : kTypes)
    for (const auto& [N, V] : {Case{64, 10000}, Case{33, 1001}, Case{5, 3}})
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " N=" << N << " V=" << V << (in_place ? " in place" : ""));
        const auto logits = randn(N * V, t, 3.0);
        const auto targets = randint(N, 0, static_cast<std::int32_t>(V));
        const double scale = 1.0 / static_cast<double>(N) * 1024.0;   // mean and a loss scale
        Tensor ld = dev(logits, {N, V}, t);
        Tensor loss = poisoned({1}, DType::f32);
        Tensor dl = in_place ? ld : poisoned({N, V}, t);
        ops::cross_entropy(g(), ld, dev_ids(targets, {N}), loss, &dl, scale);
        Tensor lr = ref(std::vector<double>(N * V), {N, V}), lossr = ref({0.0}, {1});
        Tensor dlr = ref(std::vector<double>(N * V), {N, V});
        ops::cross_entropy(c(), ref(logits, {N, V}), host_ids(targets, {N}), lossr, &dlr, scale);
        EXPECT_CLOSE(values(loss), values(lossr), 1e-5);
        EXPECT_CLOSE(values(dl), values(dlr), tolerance(t));
        // Loss only (no gradient): the logits stay untouched.
        Tensor ld2 = dev(logits, {N, V}, t);
        poison(loss);
        ops::cross_entropy(g(), ld2, dev_ids(targets, {N}), loss, nullptr, scale);
        EXPECT_CLOSE(values(loss), values(lossr), 1e-5);
        EXPECT_EQ(values(ld2), logits);
      }
}

}  // namespace
}  // namespace lmscale::test
