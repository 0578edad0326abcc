#include "lmscale/jobs/predict/parallel_bounds.h"

#include <algorithm>
#include <functional>
#include <limits>

#include <fmt/format.h>

namespace lmscale::jobs {

TensorParallelComm tensor_parallel_comm(const model::ModelDims& m, double tokens, int tp, bool sp, double e,
                                        bool recompute_forward) {
  TensorParallelComm c;
  if (tp <= 1) {
    c.formula = "none (tp = 1)";
    return c;
  }
  const int L = static_cast<int>(m.layers);
  const double f = static_cast<double>(tp - 1) / tp, act = tokens * static_cast<double>(m.d_model) * e;
  const double stats = 2 * f * tokens * 4 * 3;   // all-reduce max [tokens] + sums [tokens, 2], fp32
  if (!sp) {
    c.all_reduces = 4 * L + 2 + (recompute_forward ? 2 * L : 0);
    c.bytes = c.all_reduces * 2 * f * act + stats;
    c.formula = fmt::format("{} all-reduces x 2 (tp-1)/tp x tokens d e + loss statistics 2 (tp-1)/tp x 12 tokens",
                            c.all_reduces);
  } else {
    c.all_gathers = 6 * L + 3 + (recompute_forward ? 2 * L : 0);
    c.reduce_scatters = 4 * L + 2 + (recompute_forward ? 2 * L : 0);
    const double norms = (2.0 * L + 1) * 2 * f * 4 * static_cast<double>(m.d_model);
    c.bytes = (c.all_gathers + c.reduce_scatters) * f * act + norms + stats;
    c.formula = fmt::format("({} all-gathers + {} reduce-scatters) x (tp-1)/tp x tokens d e + (2L+1) norm-gradient "
                            "all-reduces of 4d + loss statistics",
                            c.all_gathers, c.reduce_scatters);
  }
  return c;
}

namespace {

// Smallest n in [2, limit] (by `next`) with comm_s(n) >= compute_s(n); 0 if none.
std::int64_t first_bound(std::int64_t limit, const std::function<std::int64_t(std::int64_t)>& next,
                         const std::function<bool(std::int64_t)>& bound) {
  for (std::int64_t n = 2; n <= limit; n = next(n))
    if (bound(n)) return n;
  return 0;
}

}  // namespace

std::vector<ParallelBound> parallel_bounds(const Config& cfg, double C, double W) {
  const auto m = model::ModelDims::from(cfg.model);
  const bool bench = cfg.run.job == JobKind::bench_model;
  const double tokens = static_cast<double>((bench ? cfg.bench.batch_size : cfg.train.batch_size) * m.context);
  const double flops = m.train_flops_per_token(m.context) * tokens;   // per step, all devices
  const double P = static_cast<double>(m.parameter_count());
  const double norms = (2.0 * static_cast<double>(m.layers) + 1) * static_cast<double>(m.d_model);
  const double e = computes_16bit(cfg.precision.mode, cfg.parallel.device != DeviceChoice::cpu) ? 2.0 : 4.0;
  const bool recompute = cfg.train.activation_checkpointing == Checkpointing::every_k;
  auto compute_s = [&](double n) { return flops / (n * C); };
  auto plus1 = [](std::int64_t n) { return n + 1; };
  auto times2 = [](std::int64_t n) { return 2 * n; };
  const std::int64_t kLimit = 1 << 20;
  auto fsdp_bytes = [&](double n, double params) {   // all-gather e P twice (reshard) + reduce-scatter 4P
    return (n - 1) / n * (2 * e + 4) * params;
  };
  auto tp_bytes = [&](double n, double toks, bool sp) {
    return tensor_parallel_comm(m, toks, static_cast<int>(n), sp, e, recompute).bytes;
  };
  std::vector<ParallelBound> out;

  ParallelBound dp{"data", 0, kLimit, "", "all-reduce of fp32 gradients: 2 (n-1)/n x 4P"};
  dp.degree = first_bound(kLimit, plus1, [&](std::int64_t n) {
    const double d = static_cast<double>(n);
    return 2 * (d - 1) / d * 4 * P / W >= compute_s(d);
  });
  out.push_back(dp);

  ParallelBound fs{"fsdp", 0, kLimit, "", "all-gather (n-1)/n x e P twice + reduce-scatter (n-1)/n x 4P"};
  fs.degree = first_bound(kLimit, plus1, [&](std::int64_t n) {
    const double d = static_cast<double>(n);
    return fsdp_bytes(d, P - norms) / W >= compute_s(d);
  });
  out.push_back(fs);

  for (bool sp : {false, true}) {
    ParallelBound t{sp ? "tensor+sp" : "tensor", 0, m.heads, "", tensor_parallel_comm(m, tokens, 2, sp, e, recompute).formula};
    t.degree = first_bound(m.heads, plus1, [&](std::int64_t n) {
      const double d = static_cast<double>(n);
      return tp_bytes(d, tokens, sp) / W >= compute_s(d);
    });
    out.push_back(t);
  }

  // 2D: n = X (fsdp, sharding the tp-sliced parameters) x Y (tensor, on the tokens of one fsdp
  // rank); both axes' bytes go over the same per-GPU link, one after the other. For each n (powers
  // of two) the split with the least communication time; bound when even that one is.
  ParallelBound two{"2d (fsdp x tensor)", 0, kLimit, "",
                    "fsdp over X of P/Y + tensor over Y of tokens/X (best X x Y = n)"};
  std::string best_split;
  two.degree = first_bound(kLimit, times2, [&](std::int64_t n) {
    double best = std::numeric_limits<double>::infinity();
    for (std::int64_t Y = 1; Y <= std::min<std::int64_t>(n, m.heads); Y *= 2) {
      const double X = static_cast<double>(n / Y), y = static_cast<double>(Y);
      const double bytes = (X > 1 ? fsdp_bytes(X, (P - norms) / y) : 0.0) + (Y > 1 ? tp_bytes(y, tokens / X, false) : 0.0);
      if (bytes / W < best) {
        best = bytes / W;
        best_split = fmt::format("fsdp {} x tp {}", n / Y, Y);
      }
    }
    return best >= compute_s(static_cast<double>(n));
  });
  if (two.degree > 0) two.split = best_split;
  out.push_back(two);

  if (m.moe()) {
    // Expert parallelism over n ranks (n | E), each with tokens / n of the batch and E / n experts:
    // per MoE block and micro-batch a = 4 all-to-alls (dispatch and combine, forward and backward;
    // 6 with every-k's recompute) of its tokens/n x k rows of d values, (n-1)/n of them to other
    // ranks. Both sides scale as 1/n, so the bound is a property of the model per token:
    // (n-1)/n >= F_token W / (a L_moe k d e C).
    const double a = recompute ? 6.0 : 4.0, Lm = static_cast<double>(m.moe_block_count());
    const double k = static_cast<double>(m.moe_top_k), d_model = static_cast<double>(m.d_model);
    const std::int64_t E = m.moe_experts;
    ParallelBound x{"expert", 0, E, "", fmt::format("all-to-all of the routed rows: {} x {} MoE blocks x (n-1)/n x "
                                                    "(tokens/n) x top-k {} x d {} x e (n dividing the {} experts)",
                                                    a, Lm, k, m.d_model, E)};
    auto next_divisor = [E](std::int64_t n) {
      for (++n; n <= E && E % n != 0; ++n) {
      }
      return n;
    };
    x.degree = first_bound(E, next_divisor, [&](std::int64_t n) {
      const double d = static_cast<double>(n);
      return a * Lm * (d - 1) / d * (tokens / d) * k * d_model * e / W >= compute_s(d);
    });
    out.push_back(x);
  }
  return out;
}

}  // namespace lmscale::jobs
