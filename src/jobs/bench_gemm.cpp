// bench-gemm: see include/lmscale/jobs/bench_gemm.h.
#include "lmscale/jobs/bench_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lmscale/core/cpu_model.h"
#include "lmscale/core/error.h"
#include "lmscale/core/tensor.h"
#include "lmscale/core/timer.h"
#include "lmscale/jobs/bench_random.h"
#include "lmscale/jobs/block_gemms.h"
#include "lmscale/jobs/step_rates.h"
#include "lmscale/model/fp8_layers.h"
#include "lmscale/model/model_dims.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/fp8_linear.h"
#include "lmscale/ops/ops.h"

namespace lmscale::jobs {

namespace {

constexpr const char* kGemm = "gemm";
constexpr const char* kGemmCasts = "gemm+casts";

struct Timing {
  double median = 0, min = 0, max = 0;
};

// bench.warmup untimed runs of f, then bench.steps runs each between two Runtime marks (CUDA
// events on a GPU, the wall clock on CPUs).
template <class F>
Timing time_runs(ops::Runtime& rt, const BenchConfig& b, F&& f) {
  for (std::int64_t i = 0; i < b.warmup; ++i) f();
  std::vector<double> ms;
  for (std::int64_t i = 0; i < std::max<std::int64_t>(b.steps, 1); ++i) {
    const auto begin = rt.mark();
    f();
    const auto end = rt.mark();
    ms.push_back(rt.elapsed_ms(begin, end));
  }
  const Stats s = summarize(ms);
  return {s.median, s.min, s.max};
}

// Product i of a group's [group, r, c] tensor, as [r, c].
Tensor part(const Tensor& t, std::int64_t i) { return t.slice(i, i + 1).reshape({t.dim(1), t.dim(2)}); }

// One layer's operands: x [rows, in]; the group's weights [out, in] spaced as the parameter
// store holds them (g.spacing weights apart, in one [(group-1)*spacing + 1, out, in] buffer), and
// their fp32 gradients likewise (the store's flat gradient buffer has the same layout); the
// outputs and output gradients side by side in [rows, group*out] (the model's layout, FP8 layers
// included); dx [rows, in].
struct LayerOperands {
  Tensor x, w_all, y_side, dy_side, dx, dw_all;
  std::vector<Tensor> w, dw;
};

LayerOperands make_operands(ops::Runtime& rt, const BlockGemm& g, DType compute) {
  Allocator& A = rt.allocator();
  const std::int64_t rows = g.pass == GemmPass::weight_grad ? g.k : g.m, slots = (g.group - 1) * g.spacing + 1;
  LayerOperands o;
  o.x = Tensor::empty({rows, g.in}, compute, A, "gemm_x");
  o.w_all = Tensor::empty({slots, g.out, g.in}, compute, A, "gemm_w");
  o.y_side = Tensor::empty({rows, g.group * g.out}, compute, A, "gemm_y");
  o.dy_side = Tensor::empty({rows, g.group * g.out}, compute, A, "gemm_dy");
  o.dx = Tensor::empty({rows, g.in}, compute, A, "gemm_dx");
  o.dw_all = Tensor::empty({slots, g.out, g.in}, DType::f32, A, "gemm_dw");
  fill_random(rt, o.x, 1);
  fill_random(rt, o.w_all, 2);
  fill_random(rt, o.dy_side, 3);
  for (std::int64_t i = 0; i < g.group; ++i) {
    o.w.push_back(part(o.w_all, i * g.spacing));
    o.dw.push_back(part(o.dw_all, i * g.spacing));
  }
  return o;
}

// fp32 or bf16: the model's own calls (model/transformer.cpp): a group through
// ops::linear_side_by_side (one GEMM each way for q, k, v and for w1, w3, as the store holds each
// group back to back), single layers through ops::linear.
Timing time_plain(ops::Runtime& rt, const BenchConfig& b, const BlockGemm& g, LayerOperands& o) {
  Context& ctx = rt.ctx();
  const bool grouped = g.group > 1;
  switch (g.pass) {
    case GemmPass::forward:
      return time_runs(rt, b, [&] {
        if (grouped) ops::linear_side_by_side(ctx, o.x, o.w, o.y_side);
        else ops::linear(ctx, o.x, o.w[0], o.y_side);
      });
    case GemmPass::data_grad:
      return time_runs(rt, b, [&] {
        if (grouped) ops::linear_side_by_side_backward(ctx, o.x, o.w, o.dy_side, &o.dx, nullptr, false);
        else ops::linear_backward(ctx, o.x, o.w[0], o.dy_side, &o.dx, nullptr, false);
      });
    case GemmPass::weight_grad:
      return time_runs(rt, b, [&] {
        if (grouped) ops::linear_side_by_side_backward(ctx, o.x, o.w, o.dy_side, nullptr, &o.dw, false);
        else ops::linear_backward(ctx, o.x, o.w[0], o.dy_side, nullptr, &o.dw[0], false);
      });
  }
  throw Error("bench-gemm: unknown GEMM pass");
}

// The FP8 layer of a group as the model makes it (model/fp8_layers.h): ONE layer over the
// group's rows [group*out, in] (q|k|v and w1|w3 lie back to back in the store: spacing 1),
// writing the side-by-side y and reading the side-by-side dy.
struct Fp8Operands {
  Tensor w, y, dy, dw;
};
Fp8Operands fp8_operands(const BlockGemm& g, LayerOperands& o) {
  LMSCALE_CHECK(g.spacing == 1, "bench-gemm: FP8 layer {} reads its group as one weight, but its weights lie {} apart",
                g.layer, g.spacing);
  return {o.w_all.reshape({g.group * g.out, g.in}), o.y_side, o.dy_side, o.dw_all.reshape({g.group * g.out, g.in})};
}

// fp8, the GEMMs alone: every operand quantised once beforehand (each with its own scaling, as
// the layers keep them), then only ops::linear_fp8 is timed.
Timing time_fp8_gemm(ops::Runtime& rt, const BenchConfig& b, const ops::Fp8LinearOptions& opt, const BlockGemm& g,
                     LayerOperands& o) {
  Context& ctx = rt.ctx();
  Allocator& A = rt.allocator();
  const std::int64_t rows = o.x.dim(0);
  auto scaling = [&](Fp8Format f) {
    return std::make_unique<ops::Fp8TensorScaling>(ctx, f, opt.recipe, opt.history, opt.margin);
  };
  auto fp8 = [&](std::int64_t r, std::int64_t c, Fp8Format f) { return Tensor::empty({r, c}, fp8_dtype(f), A, "gemm_fp8"); };
  const auto xs = scaling(Fp8Format::e4m3);
  Tensor xq = fp8(rows, g.in, Fp8Format::e4m3), xqt = fp8(g.in, rows, Fp8Format::e4m3);
  xs->quantize(ctx, o.x, &xq, &xqt);
  const Fp8Operands p = fp8_operands(g, o);
  const std::int64_t out = p.w.dim(0);
  const auto ws = scaling(Fp8Format::e4m3), dys = scaling(opt.grad_format);
  Tensor wq = fp8(out, g.in, Fp8Format::e4m3), wqt = fp8(g.in, out, Fp8Format::e4m3);
  ws->quantize(ctx, p.w, &wq, &wqt);
  Tensor dyq = fp8(rows, out, opt.grad_format), dyqt = fp8(out, rows, opt.grad_format);
  dys->quantize(ctx, p.dy, &dyq, &dyqt);
  Tensor y = p.y, dw = p.dw;
  // Each product accumulates as the layer runs it (precision.fp8_fast_accum).
  const ops::Fp8Accumulation fwd = opt.forward_accumulation, grad = opt.grad_accumulation;
  return time_runs(rt, b, [&] {
    if (g.pass == GemmPass::forward)   // y = x_q . w_q^T
      ops::linear_fp8(ctx, xq, xs->inv_scale(), wq, ws->inv_scale(), y, false, fwd);
    else if (g.pass == GemmPass::data_grad)   // dx = dy_q . (w^T)_q^T
      ops::linear_fp8(ctx, dyq, dys->inv_scale(), wqt, ws->inv_scale(), o.dx, false, grad);
    else   // dW = (dy^T)_q . (x^T)_q^T
      ops::linear_fp8(ctx, dyqt, dys->inv_scale(), xqt, xs->inv_scale(), dw, false, grad);
  });
}

// Whether the model's kernel producing this layer's x (grad: its dy) writes the amax, so current
// scaling runs no amax pass of its own (docs/precision.md, "Amaxes from the producers"): x of
// q|k|v, w1|w3 and w2 (the norms, SwiGLU); dy of o, w1|w3 and w2 (the norms' and SwiGLU's
// backwards; w2's except in the last block).
bool amax_from_producer(const ops::Fp8LinearOptions& opt, const BlockGemm& g, bool grad) {
  if (opt.recipe != ops::Fp8Recipe::current || !opt.producer_amax) return false;
  if (grad) return g.layer == "o" || g.layer == "w1w3" || g.layer == "w2";
  return g.layer == "qkv" || g.layer == "w1w3" || g.layer == "w2";
}

// fp8 with the operand casts: the layer's own calls (ops::Fp8Linear), as the model makes them
// (model/transformer_fp8.cpp). An operand whose amax a producer writes in the model has it
// written once here before the timing (its cost is the producer's, outside this layer) and each
// timed call casts from it.
Timing time_fp8_casts(ops::Runtime& rt, const BenchConfig& b, const ops::Fp8LinearOptions& opt, const BlockGemm& g,
                      LayerOperands& o) {
  Context& ctx = rt.ctx();
  Fp8Operands p = fp8_operands(g, o);
  ops::Fp8Linear lin(ctx, opt);
  ops::Fp8LinearSaved saved;
  const bool x_given = amax_from_producer(opt, g, false), dy_given = amax_from_producer(opt, g, true);
  if (x_given) {
    Tensor slot = lin.x_producer_amax();
    ops::amax(ctx, o.x, slot);
  }
  if (dy_given) {
    Tensor slot = lin.dy_producer_amax();
    ops::amax(ctx, p.dy, slot);
  }
  const auto x_amax = x_given ? ops::Fp8Amax::from_producer : ops::Fp8Amax::measure;
  const auto dy_amax = dy_given ? ops::Fp8Amax::from_producer : ops::Fp8Amax::measure;
  // The cast from a producer amax leaves the slot as it is: re-handing it out (host only) lets
  // every timed call read it again.
  auto forward = [&] {
    if (x_given) lin.x_producer_amax();
    saved = lin.forward(ctx, lin.quantize_input(ctx, o.x, true, x_amax), p.w, p.y);
  };
  if (g.pass == GemmPass::forward) return time_runs(rt, b, forward);
  forward();   // the saved operands the backward reads
  auto backward = [&](Tensor* dx, Tensor* dw) {
    if (dy_given) lin.dy_producer_amax();
    lin.backward(ctx, saved, p.dy, dx, dw, false, dy_amax);
  };
  if (g.pass == GemmPass::data_grad) return time_runs(rt, b, [&] { backward(&o.dx, nullptr); });
  return time_runs(rt, b, [&] { backward(nullptr, &p.dw); });
}

// How a row's products accumulate (its `accumulation` column): FP8 on CUDA as the layer's options
// say for the row's pass (precision.fp8_fast_accum); the CPU's FP8 emulation sums in fp64 and
// ignores the setting (ops::linear_fp8); fp32 and bf16 accumulate in fp32.
std::string accumulation_of(GemmPrecision p, GemmPass pass, const ops::Fp8LinearOptions& opt, bool cuda) {
  if (p != GemmPrecision::fp8) return "fp32";
  if (!cuda) return "fp64";
  const ops::Fp8Accumulation a = pass == GemmPass::forward ? opt.forward_accumulation : opt.grad_accumulation;
  return a == ops::Fp8Accumulation::fast ? "fast" : "promoted";
}

DType compute_dtype(GemmPrecision p, bool cuda) {
  switch (p) {
    case GemmPrecision::fp32: return DType::f32;
    case GemmPrecision::bf16: return DType::bf16;
    case GemmPrecision::fp8: return cuda ? DType::bf16 : DType::f32;   // the CPU emulation reads fp32
  }
  throw Error("bench-gemm: unknown precision");
}

void print_row(const io::Row& r) {
  auto str = [&](std::size_t i) { return std::get<std::string>(r[i]); };
  auto i64 = [&](std::size_t i) { return std::get<std::int64_t>(r[i]); };
  auto f64 = [&](std::size_t i) { return std::get<double>(r[i]); };
  fmt::print("{:<8} {:<7} {:<5} {:<10} {:<8} {:>5} {:>7} {:>7} {:>7} {:>10.3f} {:>9}\n", str(0), str(1), str(2),
             str(3), str(4), i64(5), i64(6), i64(7), i64(8), f64(10), three_digits(f64(13)));
}

}  // namespace

int run_bench_gemm(const Config& cfg, ops::Runtime& rt, io::ResultsFile& out) {
  const BenchConfig& b = cfg.bench;
  const model::ModelDims dims = model::ModelDims::from(cfg.model);
  const std::int64_t rows = b.batch_size * cfg.model.context_length;
  const bool cuda = rt.device() == Device::cuda;
  const ops::Fp8LinearOptions fp8 = model::fp8_options(cfg.precision);
  const std::string device = cuda ? rt.device_name() : cpu_model_name();
  const std::vector<BlockGemm> gemms = block_gemms(dims, rows);

  const std::vector<io::Column> cols = {
      {"layer", io::Column::Type::str, ""},          {"pass", io::Column::Type::str, ""},
      {"precision", io::Column::Type::str, ""},      {"variant", io::Column::Type::str, ""},
      {"accumulation", io::Column::Type::str, ""},   {"group", io::Column::Type::i64, ""},
      {"m", io::Column::Type::i64, ""},              {"n", io::Column::Type::i64, ""},
      {"k", io::Column::Type::i64, ""},
      {"flops", io::Column::Type::f64, "FLOP"},      {"time_ms", io::Column::Type::f64, "ms"},
      {"time_ms_min", io::Column::Type::f64, "ms"},  {"time_ms_max", io::Column::Type::f64, "ms"},
      {"tflops", io::Column::Type::f64, "TFLOP/s"},  {"in_block", io::Column::Type::i64, "bool"}};
  io::Table table = out.create_table("/bench_gemm/results", cols);
  const std::string g = "/bench_gemm";
  out.set_attr(g, "device_name", device);
  out.set_attr(g, "batch_size", b.batch_size);
  out.set_attr(g, "context_length", cfg.model.context_length);
  out.set_attr(g, "gemm_rows", rows);
  out.set_attr(g, "d_model", dims.d_model);
  out.set_attr(g, "d_ff", dims.d_ff);
  out.set_attr(g, "vocab_size", dims.vocab);
  out.set_attr(g, "warmup", b.warmup);
  out.set_attr(g, "steps", b.steps);
  out.set_attr(g, "flops", std::string("group * 2*M*N*K per row; TFLOP/s from the median time"));
  out.set_attr(g, "fp8_scaling", to_string(cfg.precision.fp8_scaling));
  out.set_attr(g, "fp8_grad_format", to_string(cfg.precision.fp8_grad_format));
  out.set_attr(g, "fp8_fast_accum", to_string(cfg.precision.fp8_fast_accum));
  out.set_attr(g, "gemm_autotune", std::int64_t{cfg.precision.gemm_autotune});

  fmt::print("bench-gemm on {}: d_model {}, d_ff {}, vocab {}, {} rows ({} x {} tokens); median of {} runs after {} "
             "warm-up\n",
             device, dims.d_model, dims.d_ff, dims.vocab, rows, b.batch_size, cfg.model.context_length, b.steps,
             b.warmup);
  if (std::find(b.gemm_precisions.begin(), b.gemm_precisions.end(), GemmPrecision::fp8) != b.gemm_precisions.end())
    fmt::print("fp8 accumulation: precision.fp8_fast_accum = {} (forward {}, dx and dW {}){}\n",
               cfg.precision.fp8_fast_accum, accumulation_of(GemmPrecision::fp8, GemmPass::forward, fp8, true),
               accumulation_of(GemmPrecision::fp8, GemmPass::data_grad, fp8, true),
               cuda ? "" : "; the CPU emulation sums in fp64 and ignores it");
  fmt::print("{:<8} {:<7} {:<5} {:<10} {:<8} {:>5} {:>7} {:>7} {:>7} {:>10} {:>9}\n", "layer", "pass", "prec",
             "variant", "accum", "group", "M", "N", "K", "ms", "TFLOP/s");
  // The block totals, per (precision, variant) in the order first met: summed time and FLOPs.
  struct Total {
    GemmPrecision precision;
    const char* variant;   // kGemm or kGemmCasts
    std::int64_t gemms = 0;
    double flops = 0, ms = 0;
  };
  std::vector<Total> totals;
  auto total_of = [&](GemmPrecision p, const char* v) -> Total& {
    for (Total& t : totals)
      if (t.precision == p && t.variant == v) return t;
    totals.push_back({p, v});
    return totals.back();
  };
  for (GemmPrecision p : b.gemm_precisions) {
    const DType compute = compute_dtype(p, cuda);
    std::string_view layer;
    LayerOperands ops_of_layer;
    for (const BlockGemm& gm : gemms) {
      if (p == GemmPrecision::fp8 && !gm.in_block) continue;   // the model's head runs in bf16 under fp8
      if (gm.layer != layer) {   // a layer's three passes share its operands
        ops_of_layer = LayerOperands{};
        rt.synchronize();
        ops_of_layer = make_operands(rt, gm, compute);
        layer = gm.layer;
      }
      std::vector<std::pair<const char*, Timing>> runs;
      if (p == GemmPrecision::fp8) {
        runs.emplace_back(kGemm, time_fp8_gemm(rt, b, fp8, gm, ops_of_layer));
        runs.emplace_back(kGemmCasts, time_fp8_casts(rt, b, fp8, gm, ops_of_layer));
      } else {
        runs.emplace_back(kGemm, time_plain(rt, b, gm, ops_of_layer));
      }
      for (const auto& [variant, t] : runs) {
        const double tflops = t.median > 0 ? gm.flops() / (t.median * 1e-3) / 1e12 : 0.0;
        const io::Row row = {std::string(gm.layer), std::string(gemm_pass_name(gm.pass)), to_string(p),
                             std::string(variant), accumulation_of(p, gm.pass, fp8, cuda), gm.group, gm.m, gm.n, gm.k,
                             gm.flops(), t.median, t.min, t.max, tflops, std::int64_t{gm.in_block}};
        table.append(row);
        print_row(row);
        if (gm.in_block) {
          Total& tot = total_of(p, variant);
          ++tot.gemms;
          tot.flops += gm.flops();
          tot.ms += t.median;
        }
      }
      table.flush();
      std::fflush(stdout);
    }
  }
  io::Table tot_table = out.create_table("/bench_gemm/totals", {{"precision", io::Column::Type::str, ""},
                                                                {"variant", io::Column::Type::str, ""},
                                                                {"gemms", io::Column::Type::i64, ""},
                                                                {"flops", io::Column::Type::f64, "FLOP"},
                                                                {"time_ms", io::Column::Type::f64, "ms"},
                                                                {"tflops", io::Column::Type::f64, "TFLOP/s"}});
  fmt::print("block total (the {} GEMMs of one block's training step, LM head excluded; sum of the medians):\n",
             totals.empty() ? 0 : totals.front().gemms);
  for (const Total& t : totals) {
    const double tflops = t.ms > 0 ? t.flops / (t.ms * 1e-3) / 1e12 : 0.0;
    tot_table.append({to_string(t.precision), std::string(t.variant), t.gemms, t.flops, t.ms, tflops});
    fmt::print("  {:<5} {:<10} {:>10.3f} ms  {:>9} TFLOP/s\n", t.precision, t.variant, t.ms, three_digits(tflops));
  }
  tot_table.flush();
  return 0;
}

}  // namespace lmscale::jobs
