// bench-gemm's keys against the model (docs/jobs.md, "bench-gemm"): each failure is one
// UsageError naming the key and the fix (exit 2). The device's checks (bf16 needs CUDA, fp8 on
// CUDA needs Hopper) run once the device is known (jobs/dispatch.cpp).
#include <fmt/format.h>

#include <algorithm>

#include "deck_validate.h"
#include "lmscale/core/error.h"

namespace lmscale::io::detail {

namespace {

// The FP8 GEMMs' reduction lengths and output widths are multiples of 16 on CUDA (ops::linear_fp8;
// the same rule as precision.mode = fp8, deck_fp8.cpp), and the CPU emulation is held to it too,
// so a deck that runs on the CPU runs on the GPU.
constexpr std::int64_t kFp8Multiple = 16;

}  // namespace

void check_bench_gemm(const Config& c) {
  if (c.run.job != JobKind::bench_gemm) return;
  const auto& m = c.model;
  const auto& b = c.bench;
  if (b.gemm_precisions.empty())
    throw UsageError("bench.gemm_precisions is empty; give at least one of fp32, bf16, fp8 (e.g. bench.gemm_precisions "
                     "= bf16,fp8)");
  if (m.moe_experts > 0)
    throw UsageError(fmt::format("run.job = bench-gemm times the GEMMs of a dense block, but model.moe_experts = {}; "
                                 "set model.moe_experts = 0",
                                 m.moe_experts));
  if (std::find(b.gemm_precisions.begin(), b.gemm_precisions.end(), GemmPrecision::fp8) == b.gemm_precisions.end())
    return;
  const std::int64_t rows = b.batch_size * m.context_length;
  const struct {
    const char* what;
    std::int64_t value;
    const char* fix;
  } lengths[] = {
      {"model.d_model", m.d_model, "set model.d_model to a multiple of 16"},
      {"model.d_ff", m.d_ff, "set model.d_ff to a multiple of 16"},
      {"the GEMM rows bench.batch_size * model.context_length", rows,
       "change bench.batch_size or model.context_length"},
  };
  for (const auto& l : lengths)
    if (l.value % kFp8Multiple != 0)
      throw UsageError(fmt::format("bench.gemm_precisions has fp8, whose GEMMs need {} to be a multiple of {}, but it "
                                   "is {}; {}, or drop fp8 from bench.gemm_precisions",
                                   l.what, kFp8Multiple, l.value, l.fix));
}

}  // namespace lmscale::io::detail
