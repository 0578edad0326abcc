// Elementwise ops, reductions and AdamW on CUDA against the float64 CPU reference, with sizes that
// are and are not multiples of the vector width and views that are not 16-byte aligned (the scalar
// path). DISABLED_Bandwidth times the memory-bound kernels at model scale (run it with
// --gtest_also_run_disabled_tests --gtest_filter='*Bandwidth*'; scripts/gpu/op_bandwidth.sh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "ops_cuda_test_util.h"

namespace lmscale::test {
namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};
const std::int64_t kSizes[] = {1 << 16, 1000003, 13, 8};

TEST_F(CudaOpsTest, FillAddScale) {
  for (DType t : kTypes)
    for (std::int64_t n : kSizes)
      for (std::int64_t offset : {0, 1}) {   // offset 1: a view that is not 16-byte aligned
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " n=" << n << " offset=" << offset);
        const auto a = randn(n + offset, t), b = randn(n + offset, t);
        Tensor ad = dev(a, {n + offset}, t).flat_range(offset, n), bd = dev(b, {n + offset}, t).flat_range(offset, n);
        std::vector<double> ar(a.begin() + offset, a.end()), br(b.begin() + offset, b.end());

        Tensor x = poisoned({n + offset}, t).flat_range(offset, n);
        ops::fill(g(), x, -1.75);
        EXPECT_EQ(values(x), std::vector<double>(n, -1.75));
        ops::fill(g(), x, 0.0);
        EXPECT_EQ(values(x), std::vector<double>(n, 0.0));

        Tensor out = poisoned({n + offset}, t).flat_range(offset, n);
        ops::add(g(), ad, bd, out);
        std::vector<double> want(n);
        for (std::int64_t i = 0; i < n; ++i) want[i] = ar[i] + br[i];
        EXPECT_CLOSE(values(out), want, tolerance(t));
        ops::add(g(), ad, bd, ad);   // in place: out aliases a
        EXPECT_CLOSE(values(ad), want, tolerance(t));

        ops::scale(g(), bd, -0.3);
        for (auto& v : br) v *= -0.3;
        EXPECT_CLOSE(values(bd), br, tolerance(t));
      }
}

TEST_F(CudaOpsTest, FillInt32Flag) {
  Tensor f = poisoned({1}, DType::i32);
  ops::fill(g(), f, 7);
  EXPECT_EQ(values(f), std::vector<double>{7});
}

TEST_F(CudaOpsTest, CastAllPairs) {
  const DType all[] = {DType::f32, DType::bf16, DType::f16, DType::f64};
  for (DType from : all)
    for (DType to : all)
      for (std::int64_t n : kSizes) {
        SCOPED_TRACE(::testing::Message() << dtype_name(from) << " -> " << dtype_name(to) << " n=" << n);
        const auto a = randn(n, from, 4.0);
        Tensor dst = poisoned({n}, to);
        ops::cast(g(), dev(a, {n}, from), dst);
        std::vector<double> want(a);
        for (auto& v : want) v = round_to(v, to);   // one rounding from the source value
        // Exact except fp64 -> 16-bit, which rounds through fp32 (a double rounding, < 1 ulp).
        if (from == DType::f64 && (to == DType::bf16 || to == DType::f16)) EXPECT_CLOSE(values(dst), want, tolerance(to));
        else EXPECT_EQ(values(dst), want);
      }
}

TEST_F(CudaOpsTest, CopyHostDeviceBothWays) {
  for (DType t : kTypes)
    for (std::int64_t n : kSizes) {
      const auto a = randn(n, t);
      Tensor d = poisoned({n}, t);
      ops::copy(g(), host(a, {n}, t), d);        // host -> device
      Tensor d2 = poisoned({n}, t);
      ops::copy(g(), d, d2);                     // device -> device
      Tensor h = host(std::vector<double>(n, 0.0), {n}, t);
      ops::copy(g(), d2, h);                     // device -> host, waits
      EXPECT_EQ(values(h), a);
    }
}

TEST_F(CudaOpsTest, SumSquaresDeterministic) {
  for (DType t : kTypes)
    for (std::int64_t n : {std::int64_t{1} << 22, std::int64_t{1000003}, std::int64_t{13}})
      for (std::int64_t offset : {0, 1}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " n=" << n << " offset=" << offset);
        const auto a = randn(n + offset, t);
        Tensor x = dev(a, {n + offset}, t).flat_range(offset, n);
        Tensor out = poisoned({1}, DType::f32);
        ops::sum_squares(g(), x, out);
        Tensor outr = ref({0.0}, {1});
        ops::sum_squares(c(), ref(std::vector<double>(a.begin() + offset, a.end()), {n}), outr);
        EXPECT_CLOSE(values(out), values(outr), 1e-5);
        Tensor out2 = poisoned({1}, DType::f32);
        ops::sum_squares(g(), x, out2);
        EXPECT_EQ(values(out), values(out2)) << "sum_squares must be deterministic";
      }
}

TEST_F(CudaOpsTest, CheckFinite) {
  for (DType t : kTypes)
    for (std::int64_t n : kSizes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " n=" << n);
      auto a = randn(n, t);
      Tensor flag = Tensor::empty({1}, DType::i32, gpu_.allocator(), "flag");
      ops::fill(g(), flag, 0);
      ops::check_finite(g(), dev(a, {n}, t), flag);
      EXPECT_EQ(values(flag)[0], 0) << "all finite";
      for (double bad : {INFINITY, -INFINITY, NAN}) {
        auto b = a;
        b[static_cast<std::size_t>(n - 1)] = bad;   // the last element: the tail path for odd n
        ops::fill(g(), flag, 0);
        ops::check_finite(g(), dev(b, {n}, t), flag);
        EXPECT_EQ(values(flag)[0], 1) << "non-finite " << bad;
      }
    }
}

TEST_F(CudaOpsTest, AdamWWithLowPrecisionCopy) {
  for (std::int64_t n : {std::int64_t{1} << 20, std::int64_t{100003}, std::int64_t{7}})
    for (DType lowp : {DType::bf16, DType::f16, DType::f64 /* none */}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " lowp " << (lowp == DType::f64 ? "none" : dtype_name(lowp)));
      const auto p = randn(n, DType::f32), gr = randn(n, DType::f32, 3.0), m = randn(n, DType::f32, 0.1);
      auto v = randn(n, DType::f32, 0.1);
      for (auto& x : v) x = round_to(x * x, DType::f32);
      ops::AdamWStep s;
      s.lr = 3e-3, s.beta1 = 0.9, s.beta2 = 0.95, s.eps = 1e-8, s.weight_decay = 0.1, s.step = 7, s.grad_scale = 0.25;
      Tensor pd = dev(p, {n}, DType::f32), md = dev(m, {n}, DType::f32), vd = dev(v, {n}, DType::f32);
      Tensor low = lowp == DType::f64 ? Tensor() : poisoned({n}, lowp);
      ops::adamw(g(), pd, dev(gr, {n}, DType::f32), md, vd, s, lowp == DType::f64 ? nullptr : &low);
      Tensor pr = ref(p, {n}), mr = ref(m, {n}), vr = ref(v, {n});
      ops::adamw(c(), pr, ref(gr, {n}), mr, vr, s, nullptr);
      EXPECT_CLOSE(values(pd), values(pr), 1e-5);
      EXPECT_CLOSE(values(md), values(mr), 1e-5);
      EXPECT_CLOSE(values(vd), values(vr), 1e-5);
      if (lowp != DType::f64) {
        // The working copy is the updated fp32 parameter rounded once.
        auto want = values(pd);
        for (auto& x : want) x = round_to(x, lowp);
        EXPECT_EQ(values(low), want);
      }
    }
}

// ops::adamw_pieces (the lazy gradient buckets of one process) must give bit for bit what
// ops::adamw gives piece by piece: pieces on the 8-element grid (one launch), more than the 64
// pieces one launch takes, an empty piece, and pieces off the grid (the per-piece fallback).
TEST_F(CudaOpsTest, AdamWPiecesEqualsAdamWPerPieceBitwise) {
  // Piece sizes: multiples of 8 from 8 to 24000 elements, scattered by a fixed hash.
  auto chunks = [](int i) { return static_cast<std::int64_t>((static_cast<std::uint64_t>(i) * 2654435761u) % 3000); };
  struct Layout {
    const char* name;
    std::vector<std::int64_t> sizes;
  };
  std::vector<Layout> layouts;
  layouts.push_back({"33 pieces of 8k elements", {}});
  for (int i = 0; i < 33; ++i) layouts.back().sizes.push_back(8 * (chunks(i) + 1));
  layouts.back().sizes[5] = 0;
  layouts.push_back({"70 pieces (two launches)", {}});
  for (int i = 0; i < 70; ++i) layouts.back().sizes.push_back(8 * (chunks(i) + 1));
  layouts.push_back({"off the 8-element grid", {4000, 4003, 17, 8000}});
  for (const Layout& l : layouts)
    for (DType lowp : {DType::bf16, DType::f64 /* none */}) {
      SCOPED_TRACE(::testing::Message() << l.name << " lowp " << (lowp == DType::f64 ? "none" : dtype_name(lowp)));
      std::int64_t n = 0;
      for (auto k : l.sizes) n += k;
      const auto p = randn(n, DType::f32), gr = randn(n, DType::f32, 3.0), m = randn(n, DType::f32, 0.1);
      auto v = randn(n, DType::f32, 0.1);
      for (auto& x : v) x = round_to(x * x, DType::f32);
      ops::AdamWStep s;
      s.lr = 3e-3, s.beta1 = 0.9, s.beta2 = 0.95, s.eps = 1e-8, s.weight_decay = 0.1, s.step = 7, s.grad_scale = 0.25;
      // Pieces: separate gradient tensors; the reference: the same pieces through ops::adamw.
      std::vector<ops::GradPiece> pieces;
      std::int64_t at = 0;
      for (auto k : l.sizes) {
        std::vector<double> part(gr.begin() + at, gr.begin() + at + k);
        pieces.push_back({at, dev(part, {k}, DType::f32)});
        at += k;
      }
      Tensor pa = dev(p, {n}, DType::f32), ma = dev(m, {n}, DType::f32), va = dev(v, {n}, DType::f32);
      Tensor pb = dev(p, {n}, DType::f32), mb = dev(m, {n}, DType::f32), vb = dev(v, {n}, DType::f32);
      Tensor la = lowp == DType::f64 ? Tensor() : poisoned({n}, lowp);
      Tensor lb = lowp == DType::f64 ? Tensor() : poisoned({n}, lowp);
      ops::adamw_pieces(g(), pa, pieces, ma, va, s, lowp == DType::f64 ? nullptr : &la);
      for (const auto& piece : pieces) {
        const std::int64_t k = piece.grad.numel();
        Tensor pp = pb.flat_range(piece.offset, k), mp = mb.flat_range(piece.offset, k), vp = vb.flat_range(piece.offset, k);
        Tensor lp;
        if (lowp != DType::f64) lp = lb.flat_range(piece.offset, k);
        ops::adamw(g(), pp, piece.grad, mp, vp, s, lowp == DType::f64 ? nullptr : &lp);
      }
      EXPECT_EQ(values(pa), values(pb));
      EXPECT_EQ(values(ma), values(mb));
      EXPECT_EQ(values(va), values(vb));
      if (lowp != DType::f64) EXPECT_EQ(values(la), values(lb));
    }
}

// ---- bandwidth (not a correctness test; run explicitly) ----------------------------------------
class Bandwidth : public CudaOpsTest {
 protected:
  // Median of `reps` timed runs of fn, in ms (CUDA events on the compute stream).
  template <class F>
  double time_ms(F&& fn, int reps = 10) {
    fn();
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      auto a = gpu_.mark();
      fn();
      auto b = gpu_.mark();
      ms.push_back(gpu_.elapsed_ms(a, b));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
  void report(const char* what, double bytes, double ms) {
    std::printf("BW %-44s %9.3f ms %8.1f GB/s\n", what, ms, bytes / (ms * 1e-3) / 1e9);
  }
};

TEST_F(Bandwidth, DISABLED_ModelScale) {
  // AdamW over the xl model's parameters (about 2.0e9), bf16 working copy.
  const std::int64_t P = 2'000'000'000;
  {
    Tensor p = Tensor::empty({P}, DType::f32, gpu_.allocator(), "p"), gr = Tensor::empty({P}, DType::f32, gpu_.allocator(), "g");
    Tensor m = Tensor::empty({P}, DType::f32, gpu_.allocator(), "m"), v = Tensor::empty({P}, DType::f32, gpu_.allocator(), "v");
    Tensor low = Tensor::empty({P}, DType::bf16, gpu_.allocator(), "low");
    ops::fill(g(), p, 0.5), ops::fill(g(), gr, 0.01), ops::fill(g(), m, 1e-3), ops::fill(g(), v, 1e-4);
    ops::AdamWStep s;
    const double ms = time_ms([&] { ops::adamw(g(), p, gr, m, v, s, &low); }, 5);
    report("adamw 2e9 fp32 + bf16 copy (30 B/param)", 30.0 * P, ms);
    const double ms2 = time_ms([&] { ops::adamw(g(), p, gr, m, v, s, nullptr); }, 5);
    report("adamw 2e9 fp32 (28 B/param)", 28.0 * P, ms2);
    Tensor out = Tensor::empty({1}, DType::f32, gpu_.allocator(), "out");
    report("sum_squares 2e9 fp32", 4.0 * P, time_ms([&] { ops::sum_squares(g(), gr, out); }, 5));
    report("cast 2e9 fp32 -> bf16", 6.0 * P, time_ms([&] { ops::cast(g(), p, low); }, 5));
    report("copy 2e9 fp32 d2d (cudaMemcpyAsync)", 8.0 * P, time_ms([&] { ops::copy(g(), p, m); }, 5));
  }
  // Activation-sized kernels of the xl model at batch 4 x 512 tokens, bf16.
  const std::int64_t N = 2048, d = 1600, F = 6400, V = 10000;
  const DType t = DType::bf16;
  auto rnd = [&](std::int64_t n) { return dev(randn(static_cast<std::size_t>(n), t), {n}, t); };
  Tensor x = rnd(N * d).reshape({N, d}), dy = rnd(N * d).reshape({N, d}), y = rnd(N * d).reshape({N, d});
  Tensor w = Tensor::empty({d}, DType::f32, gpu_.allocator(), "w"), dw = Tensor::empty({d}, DType::f32, gpu_.allocator(), "dw");
  ops::fill(g(), w, 1.0), ops::fill(g(), dw, 0.0);
  Tensor rstd = Tensor::empty({N}, DType::f32, gpu_.allocator(), "rstd");
  report("rmsnorm fwd 2048x1600 bf16", 2.0 * 2 * N * d, time_ms([&] { ops::rmsnorm(g(), x, w, 1e-5, y, rstd); }));
  report("rmsnorm bwd 2048x1600 bf16", 2.0 * 3 * N * d,
         time_ms([&] { ops::rmsnorm_backward(g(), x, w, rstd, dy, y, dw); }));
  Tensor a = rnd(N * F), b = rnd(N * F), h = rnd(N * F), da = rnd(N * F), db = rnd(N * F);
  report("swiglu fwd 2048x6400 bf16", 2.0 * 3 * N * F, time_ms([&] { ops::swiglu(g(), a, b, h); }));
  report("swiglu bwd 2048x6400 bf16", 2.0 * 5 * N * F, time_ms([&] { ops::swiglu_backward(g(), a, b, h, da, db); }));
  Tensor q = rnd(N * d);
  report("rope 4x512x25x64 bf16", 2.0 * 2 * N * d, time_ms([&] { ops::rope(g(), q, 4, 512, 25, 64, 10000.0, false); }));
  Tensor logits = rnd(N * V).reshape({N, V}), dl = rnd(N * V).reshape({N, V});
  Tensor targets = dev_ids(randint(N, 0, static_cast<std::int32_t>(V)), {N});
  Tensor loss = Tensor::empty({1}, DType::f32, gpu_.allocator(), "loss");
  report("cross_entropy+grad 2048x10000 bf16", 2.0 * 2 * N * V,
         time_ms([&] { ops::cross_entropy(g(), logits, targets, loss, &dl, 1.0 / N); }));
  Tensor table = rnd(V * d).reshape({V, d}), dtable = Tensor::empty({V, d}, DType::f32, gpu_.allocator(), "dtable");
  ops::fill(g(), dtable, 0.0);
  report("embedding fwd 2048x1600 bf16", 2.0 * 2 * N * d, time_ms([&] { ops::embedding(g(), targets, table, y); }));
  report("embedding bwd 2048x1600 bf16 -> fp32", (2.0 + 8.0) * N * d,
         time_ms([&] { ops::embedding_backward(g(), targets, dy, dtable); }));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// cuBLASLt throughput at the xl model's GEMM shapes (batch 4 x 512 tokens): forward, and the
// backward's dx + dw (dw accumulated in fp32, as the model does in mixed precision).
TEST_F(Bandwidth, DISABLED_Gemm) {
  struct Shape3 {
    const char* name;
    std::int64_t M, K, N;
  };
  const Shape3 shapes[] = {{"qkvo 2048x1600x1600", 2048, 1600, 1600},
                           {"w1/w3 2048x1600->6400", 2048, 1600, 6400},
                           {"w2 2048x6400->1600", 2048, 6400, 1600},
                           {"lm_head 2048x1600->10000", 2048, 1600, 10000}};
  for (bool autotune : {false, true}) {
    if (autotune) setenv("LMSCALE_GEMM_AUTOTUNE", "1", 1);
    ops::Runtime rt(Device::cuda, 0, false);
    unsetenv("LMSCALE_GEMM_AUTOTUNE");
    Context& ctx = rt.ctx();
    for (const auto& [t, tf32] : {std::pair{DType::bf16, false}, std::pair{DType::f32, false}, std::pair{DType::f32, true}})
      for (const auto& sh : shapes) {
        ctx.allow_tf32 = tf32;
        auto rnd = [&](std::int64_t r, std::int64_t c) { return dev(randn(static_cast<std::size_t>(r * c), t), {r, c}, t); };
        Tensor x = rnd(sh.M, sh.K), w = rnd(sh.N, sh.K), y = rnd(sh.M, sh.N), dx = rnd(sh.M, sh.K);
        Tensor dw = Tensor::empty({sh.N, sh.K}, DType::f32, gpu_.allocator(), "dw");
        ops::fill(g(), dw, 0.0);
        gpu_.synchronize();
        auto timed = [&](auto&& fn) {
          fn();
          std::vector<double> ms;
          for (int i = 0; i < 10; ++i) {
            auto a = rt.mark();
            fn();
            auto b = rt.mark();
            ms.push_back(rt.elapsed_ms(a, b));
          }
          std::sort(ms.begin(), ms.end());
          return ms[5];
        };
        const double f = 2.0 * sh.M * sh.K * sh.N;
        const double fwd = timed([&] { ops::linear(ctx, x, w, y); });
        const double bwd = timed([&] { ops::linear_backward(ctx, x, w, y, &dx, &dw, true); });
        std::printf("GEMM%s %-5s%-5s %-26s fwd %8.3f ms %6.0f TFLOP/s   bwd %8.3f ms %6.0f TFLOP/s\n",
                    autotune ? " tuned" : "      ", dtype_name(t), tf32 ? "+tf32" : "", sh.name, fwd,
                    f / (fwd * 1e-3) / 1e12, bwd, 2 * f / (bwd * 1e-3) / 1e12);
        rt.synchronize();
      }
  }
  g().allow_tf32 = false;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace lmscale::test
