// bench-attention: see include/lmscale/jobs/bench_attention.h.
#include "lmscale/jobs/bench_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "lmscale/core/error.h"
#include "lmscale/core/tensor.h"
#include "lmscale/jobs/bench_random.h"
#include "lmscale/jobs/step_rates.h"
#include "lmscale/ops/ops.h"

namespace lmscale::jobs {

double attention_flops(AttentionPass pass, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                       std::int64_t head_dim, bool causal) {
  const double fwd = 4.0 * static_cast<double>(batch) * static_cast<double>(heads) * static_cast<double>(seq) *
                     static_cast<double>(seq) * static_cast<double>(head_dim) * (causal ? 0.5 : 1.0);
  switch (pass) {
    case AttentionPass::forward: return fwd;
    case AttentionPass::backward: return 2.5 * fwd;
    case AttentionPass::forward_backward: return 3.5 * fwd;
  }
  throw UsageError(fmt::format("bench.passes: unknown pass '{}' (forward | backward | forward-backward)", pass));
}

namespace {

struct Case {
  AttentionImpl impl;
  FloatType dtype;
  bool causal;
  std::int64_t batch, heads, seq, head_dim;
};

struct Timing {
  double median = 0, min = 0, max = 0;
};

template <class F>
Timing time_runs(ops::Runtime& rt, std::int64_t warmup, std::int64_t steps, F&& f) {
  for (std::int64_t i = 0; i < warmup; ++i) f();
  std::vector<double> ms;
  for (std::int64_t i = 0; i < std::max<std::int64_t>(steps, 1); ++i) {
    const auto a = rt.mark();
    f();
    const auto b = rt.mark();
    ms.push_back(rt.elapsed_ms(a, b));
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
}

// One case: allocates inputs and outputs, runs each requested pass; returns one row per pass.
std::vector<io::Row> run_case(const Config& cfg, ops::Runtime& rt, const Case& c, std::size_t& mem_before_bwd) {
  Context& ctx = rt.ctx();
  Allocator& alloc = rt.allocator();
  const DType dt = dtype_of(c.dtype);
  const auto s = ops::AttentionShape::bhtd(c.batch, c.heads, c.seq, c.head_dim, c.causal);
  const std::int64_t n = s.elements(), rows = c.batch * c.heads * c.seq;
  const bool flash = c.impl == AttentionImpl::flash;
  Tensor q = Tensor::empty({n}, dt, alloc, "attn_q"), k = Tensor::empty({n}, dt, alloc, "attn_k"),
         v = Tensor::empty({n}, dt, alloc, "attn_v"), o = Tensor::empty({n}, dt, alloc, "attn_o");
  fill_random(rt, q, 1);
  fill_random(rt, k, 2);
  fill_random(rt, v, 3);
  // flash saves lse [B,H,T] (fp32; fp64 for fp64), naive saves probs [B,H,T,T] in the input dtype.
  Tensor saved = flash ? Tensor::empty({rows}, dt == DType::f64 ? DType::f64 : DType::f32, alloc, "attn_lse")
                       : Tensor::empty({rows * c.seq}, dt, alloc, "attn_probs");
  auto forward = [&] {
    if (flash) ops::attention_flash(ctx, s, q, k, v, o, saved);
    else ops::attention_naive(ctx, s, q, k, v, o, saved);
  };
  forward();
  rt.synchronize();
  // What the backward starts from: inputs, output and saved tensors (plus dO below).
  Tensor dout = Tensor::empty({n}, dt, alloc, "attn_do");
  fill_random(rt, dout, 4);
  rt.synchronize();
  mem_before_bwd = alloc.tracker().current();
  Tensor dq = Tensor::empty({n}, dt, alloc, "attn_dq"), dk = Tensor::empty({n}, dt, alloc, "attn_dk"),
         dv = Tensor::empty({n}, dt, alloc, "attn_dv");
  auto backward = [&] {
    if (flash) ops::attention_flash_backward(ctx, s, q, k, v, o, saved, dout, dq, dk, dv);
    else ops::attention_naive_backward(ctx, s, q, k, v, saved, dout, dq, dk, dv);
  };
  std::vector<io::Row> out;
  for (const auto& pass : cfg.bench.passes) {
    Timing t;
    if (pass == AttentionPass::forward) t = time_runs(rt, cfg.bench.warmup, cfg.bench.steps, forward);
    else if (pass == AttentionPass::backward) t = time_runs(rt, cfg.bench.warmup, cfg.bench.steps, backward);
    else t = time_runs(rt, cfg.bench.warmup, cfg.bench.steps, [&] { forward(); backward(); });
    const double tflops = attention_flops(pass, c.batch, c.heads, c.seq, c.head_dim, c.causal) / (t.median * 1e-3) / 1e12;
    out.push_back({to_string(c.impl), to_string(pass), to_string(c.dtype), std::int64_t{c.causal}, c.batch, c.heads, c.seq, c.head_dim, t.median, t.min,
                   t.max, tflops, static_cast<std::int64_t>(mem_before_bwd), std::string("ok")});
  }
  return out;
}

void print_row(const io::Row& r) {
  auto str = [&](std::size_t i) { return std::get<std::string>(r[i]); };
  auto i64 = [&](std::size_t i) { return std::get<std::int64_t>(r[i]); };
  auto f64 = [&](std::size_t i) { return std::get<double>(r[i]); };
  // TFLOP/s in three significant digits (step_rates.h): a CPU's 0.0123 does not print as 0.0.
  fmt::print("{:<6} {:<16} {:<5} {:>6} {:>5} {:>5} {:>6} {:>4} {:>10.3f} {:>9} {:>12.1f} {}\n", str(0), str(1),
             str(2), i64(3) ? "causal" : "full", i64(4), i64(5), i64(6), i64(7), f64(8), three_digits(f64(11)),
             static_cast<double>(i64(12)) / 1048576.0, str(13));
}

}  // namespace

int run_bench_attention(const Config& cfg, ops::Runtime& rt, io::ResultsFile& out) {
  const auto& b = cfg.bench;
  const std::vector<io::Column> cols = {
      {"impl", io::Column::Type::str, ""},         {"pass", io::Column::Type::str, ""},
      {"dtype", io::Column::Type::str, ""},        {"causal", io::Column::Type::i64, "bool"},
      {"batch", io::Column::Type::i64, ""},        {"heads", io::Column::Type::i64, ""},
      {"seq", io::Column::Type::i64, "tokens"},    {"head_dim", io::Column::Type::i64, ""},
      {"time_ms", io::Column::Type::f64, "ms"},    {"time_ms_min", io::Column::Type::f64, "ms"},
      {"time_ms_max", io::Column::Type::f64, "ms"}, {"tflops", io::Column::Type::f64, "TFLOP/s"},
      {"mem_before_backward_bytes", io::Column::Type::i64, "bytes"}, {"status", io::Column::Type::str, ""}};
  io::Table table = out.create_table("/bench_attention/results", cols);
  out.set_attr("/bench_attention", "device", rt.device_name());
  out.set_attr("/bench_attention", "flops",
               std::string("forward 4*B*H*T*T*D (x0.5 causal); backward 2.5x forward; forward-backward 3.5x forward"));
  out.set_attr("/bench_attention", "layout", std::string("[B, H, T, D]"));
  fmt::print("bench-attention on {}: median of {} steps after {} warm-up\n", rt.device_name(), b.steps, b.warmup);
  fmt::print("{:<6} {:<16} {:<5} {:>6} {:>5} {:>5} {:>6} {:>4} {:>10} {:>9} {:>12} {}\n", "impl", "pass", "dtype",
             "mask", "B", "H", "T", "D", "ms", "TFLOP/s", "mem_bwd_MiB", "status");
  std::int64_t ooms = 0;
  for (const auto& impl : b.impls)
    for (const auto& dtype : b.dtypes)
      for (bool causal : b.causal)
        for (auto batch : b.attn_batch)
          for (auto heads : b.attn_heads)
            for (auto head_dim : b.head_dims)
              for (auto seq : b.seq_lens) {
                const Case c{impl, dtype, causal, batch, heads, seq, head_dim};
                std::vector<io::Row> rows;
                std::size_t mem = 0;
                try {
                  rows = run_case(cfg, rt, c, mem);
                } catch (const OutOfMemory&) {
                  // Everything run_case allocated is freed by now (its tensors are gone); hand the
                  // cache back so the next case starts from an empty pool.
                  rt.synchronize();
                  rt.allocator().release_cached();
                  ++ooms;
                  for (const auto& pass : b.passes)
                    rows.push_back({to_string(impl), to_string(pass), to_string(dtype), std::int64_t{causal}, batch, heads, seq, head_dim, 0.0, 0.0,
                                    0.0, 0.0, static_cast<std::int64_t>(mem), std::string("OOM")});
                }
                for (const auto& r : rows) {
                  table.append(r);
                  print_row(r);
                }
                table.flush();
                std::fflush(stdout);
              }
  out.set_attr("/bench_attention", "oom_cases", ooms);
  return 0;
}

}  // namespace lmscale::jobs
