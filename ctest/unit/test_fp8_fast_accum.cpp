// precision.fp8_fast_accum (docs/precision.md, "The GEMMs and their layouts" and "Error bounds"):
// the deck key (default forward, its three values, refused outside precision.mode = fp8, a bad
// value refused naming the key), its mapping onto the FP8 layers' options, the CPU emulation
// ignoring it (bitwise the same products), and, in CUDA builds, the GEMM plan key that keeps a
// fast and a promoted product on different cuBLASLt plans (host arithmetic: no GPU needed).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"
#include "lmscale/model/fp8_layers.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/fp8_linear.h"
#include "ops_test_util.h"
#ifdef LMSCALE_WITH_CUDA
#include "../../src/ops/cuda/gemm.h"
#endif

namespace lmscale::test {
namespace {

using io::parse_deck_text;

// The UsageError message of parsing `deck` ("" when it parses).
std::string deck_error(const std::string& deck) {
  try {
    parse_deck_text(deck, {}, 1);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(Fp8FastAccumDeck, DefaultsToForwardThePeersRecipe) {
  EXPECT_EQ(Config{}.precision.fp8_fast_accum, Fp8FastAccum::forward);
  EXPECT_EQ(parse_deck_text("", {}, 1).precision.fp8_fast_accum, Fp8FastAccum::forward);
  EXPECT_EQ(parse_deck_text("[precision]\nmode = fp8\n", {}, 1).precision.fp8_fast_accum, Fp8FastAccum::forward);
}

TEST(Fp8FastAccumDeck, ParsesEachValueUnderFp8AndRoundTrips) {
  const std::pair<const char*, Fp8FastAccum> cases[] = {
      {"none", Fp8FastAccum::none}, {"forward", Fp8FastAccum::forward}, {"all", Fp8FastAccum::all}};
  for (const auto& [text, value] : cases) {
    SCOPED_TRACE(text);
    const Config c = parse_deck_text(std::string("[precision]\nmode = fp8\nfp8_fast_accum = ") + text + "\n", {}, 1);
    EXPECT_EQ(c.precision.fp8_fast_accum, value);
    EXPECT_EQ(parse_deck_text(io::to_ini(c), {}, 1).precision.fp8_fast_accum, value);
    EXPECT_EQ(parse_deck_text("", {"precision.mode=fp8", std::string("precision.fp8_fast_accum=") + text}, 1)
                  .precision.fp8_fast_accum,
              value);
  }
}

TEST(Fp8FastAccumDeck, RefusedOutsideFp8UnlessDefault) {
  // The default may stand in any mode (every deck carries it); another value names key and fix.
  EXPECT_EQ(deck_error("[precision]\nmode = bf16\nfp8_fast_accum = forward\n"), "");
  for (const char* value : {"none", "all"}) {
    SCOPED_TRACE(value);
    const std::string e = deck_error(std::string("[precision]\nmode = bf16\nfp8_fast_accum = ") + value + "\n");
    EXPECT_NE(e.find("precision.fp8_fast_accum = " + std::string(value)), std::string::npos) << e;
    EXPECT_NE(e.find("precision.mode = bf16"), std::string::npos) << e;
    EXPECT_NE(e.find("set precision.mode = fp8"), std::string::npos) << e;
  }
  EXPECT_NE(deck_error("[precision]\nfp8_fast_accum = none\n").find("precision.fp8_fast_accum"), std::string::npos);
}

TEST(Fp8FastAccumDeck, BadValueNamesTheKeyAndTheValues) {
  const std::string e = deck_error("[precision]\nmode = fp8\nfp8_fast_accum = fast\n");
  EXPECT_NE(e.find("precision.fp8_fast_accum"), std::string::npos) << e;
  EXPECT_NE(e.find("none, forward, all"), std::string::npos) << e;
}

TEST(Fp8FastAccumOptions, DeckValueSetsEachProductKind) {
  using ops::Fp8Accumulation;
  const struct {
    Fp8FastAccum deck;
    Fp8Accumulation forward, grad;
  } cases[] = {{Fp8FastAccum::none, Fp8Accumulation::promoted, Fp8Accumulation::promoted},
               {Fp8FastAccum::forward, Fp8Accumulation::fast, Fp8Accumulation::promoted},
               {Fp8FastAccum::all, Fp8Accumulation::fast, Fp8Accumulation::fast}};
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c.deck));
    PrecisionConfig p;
    p.mode = PrecisionMode::fp8;
    p.fp8_fast_accum = c.deck;
    const ops::Fp8LinearOptions o = model::fp8_options(p);
    EXPECT_EQ(o.forward_accumulation, c.forward);
    EXPECT_EQ(o.grad_accumulation, c.grad);
  }
  // The layers' own default is the deck's.
  const ops::Fp8LinearOptions deck = model::fp8_options(PrecisionConfig{}), plain;
  EXPECT_EQ(plain.forward_accumulation, deck.forward_accumulation);
  EXPECT_EQ(plain.grad_accumulation, deck.grad_accumulation);
}

// The CPU reference multiplies exactly in fp64: it has no reduced accumulator to emulate, so the
// setting changes nothing there (a CPU fp8 run is the same for every precision.fp8_fast_accum).
class Fp8FastAccumCpu : public OpsTest {};

TEST_F(Fp8FastAccumCpu, EmulationIgnoresTheSetting) {
  const std::int64_t M = 32, K = 64, N = 48;
  const Tensor x = randn({M, K}, 1), w = randn({N, K}, 2, 0.05), dy = randn({M, N}, 3, 1e-3);
  struct Out {
    Tensor y, dx, dw;
  };
  auto run = [&](ops::Fp8Accumulation fwd, ops::Fp8Accumulation grad) {
    ops::Fp8LinearOptions o;
    o.forward_accumulation = fwd;
    o.grad_accumulation = grad;
    ops::Fp8Linear lin(ctx, o);
    Out out{poisoned({M, N}), poisoned({M, K}), poisoned({N, K})};
    const ops::Fp8LinearSaved saved = lin.forward(ctx, x, w, out.y);
    lin.backward(ctx, saved, dy, &out.dx, &out.dw, false);
    return out;
  };
  const Out promoted = run(ops::Fp8Accumulation::promoted, ops::Fp8Accumulation::promoted);
  const Out fast = run(ops::Fp8Accumulation::fast, ops::Fp8Accumulation::fast);
  EXPECT_EQ(values(fast.y), values(promoted.y));
  EXPECT_EQ(values(fast.dx), values(promoted.dx));
  EXPECT_EQ(values(fast.dw), values(promoted.dw));
}

#ifdef LMSCALE_WITH_CUDA
// The key of an FP8 product as ops::linear_fp8 makes it (TN, e4m3 x e4m3 -> bf16); the pointers
// only give the alignments the key holds (nothing is read).
ops::cuda::GemmArgs fp8_product(bool fast) {
  alignas(256) static const unsigned char a[256] = {}, b[256] = {};
  alignas(256) static unsigned char c[256] = {};
  ops::cuda::GemmArgs g;
  g.trans_a = true;
  g.m = 1600, g.n = 8192, g.k = 1600;
  g.a = a, g.lda = 1600;
  g.b = b, g.ldb = 1600;
  g.c = c, g.ldc = 1600;
  g.ab_type = DType::e4m3, g.b_type = DType::e4m3, g.c_type = DType::bf16;
  g.fast_accum = fast;
  return g;
}
#endif

TEST(Fp8FastAccumPlanKey, FastAndPromotedProductsHaveDifferentPlans) {
#ifndef LMSCALE_WITH_CUDA
  GTEST_SKIP() << "the GEMM plan cache is built with CUDA only";
#else
  const auto promoted = ops::cuda::gemm_plan_key(fp8_product(false), false, 0);
  const auto fast = ops::cuda::gemm_plan_key(fp8_product(true), false, 0);
  EXPECT_FALSE(promoted == fast);
  // Only the flags differ, so the shape classes (the key with m, n, k rounded) differ too.
  EXPECT_EQ(promoted.m, fast.m);
  EXPECT_EQ(promoted.n, fast.n);
  EXPECT_EQ(promoted.k, fast.k);
  EXPECT_NE(promoted.flags, fast.flags);
  // The same request gives the same key (a cache hit), and the bit is not lost among the others:
  // an accumulating fp32-output product, fast against promoted, still differs in it alone.
  EXPECT_TRUE(ops::cuda::gemm_plan_key(fp8_product(true), false, 0) == fast);
  const auto accumulating = [](bool fast_accum) {
    ops::cuda::GemmArgs acc = fp8_product(fast_accum);
    acc.beta = 1.f;
    acc.c_type = DType::f32;
    return ops::cuda::gemm_plan_key(acc, false, 0);
  };
  EXPECT_FALSE(accumulating(true) == accumulating(false));
  EXPECT_FALSE(accumulating(true) == fast);
#endif
}

}  // namespace
}  // namespace lmscale::test
