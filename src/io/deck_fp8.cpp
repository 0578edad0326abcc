// The FP8 keys (precision.mode = fp8, precision.fp8_*) against each other, the layout and the
// model's shapes (docs/precision.md, "FP8 training"). Each failure is one UsageError naming the
// key and the fix (exit 2). The device's own check (a Hopper GPU) runs at start-up, where the
// device is known (jobs/engine/trainer.cpp): the deck alone does not know it.
#include <fmt/format.h>

#include <algorithm>

#include "deck_validate.h"
#include "lmscale/core/error.h"

namespace lmscale::io::detail {

namespace {

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw UsageError(fmt::format(format, std::forward<Args>(args)...));
}

// cuBLASLt's FP8 GEMMs take reduction lengths and output widths that are multiples of 16
// (ops::linear_fp8; docs/precision.md, "The GEMMs and their layouts"). The CPU emulation takes
// any shape but is held to the same rule, so a deck that runs on the CPU runs on the GPU too.
constexpr std::int64_t kFp8Multiple = 16;

void check_multiple(const char* what, std::int64_t value, const std::string& fix) {
  if (value % kFp8Multiple != 0)
    fail("precision.mode = fp8 needs {} to be a multiple of {} (the FP8 GEMMs' rule), but it is {}; {}", what,
         kFp8Multiple, value, fix);
}

}  // namespace

void check_fp8(const Config& c, int world_size) {
  const auto& pr = c.precision;
  const PrecisionConfig defaults;
  // parallel.fsdp_gather_dtype = fp8 (docs/parallel.md, "FP8 weight gathers"): FP8 weights exist
  // only under precision.mode = fp8, fsdp is what gathers them, and the gather's scale is current
  // scaling's (the amax of the weight now); delayed scaling would need the weights' amax histories
  // beside the shards (not built).
  if (c.parallel.fsdp_gather_dtype == FsdpGatherDtype::fp8) {
    if (c.parallel.zero != ZeroLevel::fsdp)
      fail("parallel.fsdp_gather_dtype = fp8 applies to fsdp's weight gathers, but parallel.zero = {}; set "
           "parallel.zero = fsdp or parallel.fsdp_gather_dtype = compute",
           c.parallel.zero);
    if (pr.mode != PrecisionMode::fp8)
      fail("parallel.fsdp_gather_dtype = fp8 gathers the weights of FP8 GEMMs, but precision.mode = {}; set "
           "precision.mode = fp8 or parallel.fsdp_gather_dtype = compute",
           pr.mode);
    if (pr.fp8_scaling != Fp8Scaling::current)
      fail("parallel.fsdp_gather_dtype = fp8 supports precision.fp8_scaling = current only (the gather's scale is "
           "the weight's amax now), but precision.fp8_scaling = {}; set precision.fp8_scaling = current or "
           "parallel.fsdp_gather_dtype = compute",
           pr.fp8_scaling);
  }
  if (pr.mode != PrecisionMode::fp8) {
    const auto other = [&](const char* key, const std::string& value) {
      fail("{} = {} applies to precision.mode = fp8 only, but precision.mode = {}; remove {} or set precision.mode = "
           "fp8",
           key, value, pr.mode, key);
    };
    if (pr.fp8_scaling != defaults.fp8_scaling) other("precision.fp8_scaling", fmt::format("{}", pr.fp8_scaling));
    if (pr.fp8_history != defaults.fp8_history) other("precision.fp8_history", std::to_string(pr.fp8_history));
    if (pr.fp8_margin != defaults.fp8_margin) other("precision.fp8_margin", std::to_string(pr.fp8_margin));
    if (pr.fp8_grad_format != defaults.fp8_grad_format)
      other("precision.fp8_grad_format", fmt::format("{}", pr.fp8_grad_format));
    if (pr.fp8_fast_accum != defaults.fp8_fast_accum)
      other("precision.fp8_fast_accum", fmt::format("{}", pr.fp8_fast_accum));
    if (pr.fp8_weight_casts != defaults.fp8_weight_casts)
      other("precision.fp8_weight_casts", fmt::format("{}", pr.fp8_weight_casts));
    return;
  }
  if (pr.fp8_history != defaults.fp8_history && pr.fp8_scaling != Fp8Scaling::delayed)
    fail("precision.fp8_history = {} is the window of delayed scaling, but precision.fp8_scaling = {}; set "
         "precision.fp8_scaling = delayed or remove precision.fp8_history",
         pr.fp8_history, pr.fp8_scaling);
  const auto& p = c.parallel;
  const auto& m = c.model;
  if (p.tp > 1)
    fail("precision.mode = fp8 with parallel.tp = {}: tensor parallelism is not yet supported in FP8; set "
         "parallel.tp = 1 or precision.mode = bf16",
         p.tp);
  if (p.pp > 1)
    fail("precision.mode = fp8 with parallel.pp = {}: pipeline parallelism is not yet supported in FP8; set "
         "parallel.pp = 1 or precision.mode = bf16",
         p.pp);
  if (m.moe_experts > 0)
    fail("precision.mode = fp8 with model.moe_experts = {}: MoE models are not yet supported in FP8 (only dense "
         "blocks' linear layers have FP8 GEMMs); set model.moe_experts = 0 or precision.mode = bf16",
         m.moe_experts);
  check_multiple("model.d_model (the q, k, v widths and every projection's input)", m.d_model,
                 "set model.d_model to a multiple of 16 or precision.mode = bf16");
  check_multiple("model.d_ff", m.d_ff, "set model.d_ff to a multiple of 16 or precision.mode = bf16");
  // Rows per micro-batch (B*T): the weight gradient's reduction length.
  const std::int64_t T = m.context_length, dp = std::max<std::int64_t>(1, resolved_dp(c, world_size));
  std::int64_t rows = 0;
  const char* batch_key = "";
  if (c.run.job == JobKind::train || c.run.job == JobKind::prune) {
    rows = c.train.batch_size / dp / std::max<std::int64_t>(1, c.train.grad_accum) * T;
    batch_key = "train.batch_size / (data-parallel ranks * train.grad_accum) * model.context_length";
  } else if (c.run.job == JobKind::bench_model) {
    rows = c.bench.batch_size / dp * T;
    batch_key = "bench.batch_size / data-parallel ranks * model.context_length";
  }
  if (rows > 0 && rows % kFp8Multiple != 0)
    fail("precision.mode = fp8 needs the rows of each micro-batch ({} = {}) to be a multiple of {} (the reduction "
         "length of the FP8 weight-gradient GEMM); change model.context_length or the batch keys, or set "
         "precision.mode = bf16",
         batch_key, rows, kFp8Multiple);
}

}  // namespace lmscale::io::detail
