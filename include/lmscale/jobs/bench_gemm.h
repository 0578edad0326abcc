#pragma once
// Job `bench-gemm` (docs/jobs.md): the GEMM rate of the linear layers of the deck's model, through
// lmscale's own GEMM paths. For every GEMM of one dense block's training step and of the LM head
// (jobs/block_gemms.h: rows = bench.batch_size * model.context_length) and every item of
// bench.gemm_precisions:
//   fp32, bf16  the model's calls: ops::linear / linear_side_by_side forward,
//               ops::linear_backward / linear_side_by_side_backward for dx and dW (dW in fp32, as the model's gradients), one row (variant "gemm");
//   fp8         the FP8 layers of precision.mode = fp8 (ops::Fp8Linear, precision.fp8_* scaling;
//               q|k|v and w1|w3 one FP8 layer each over the group's rows, as the model runs
//               them), two rows: "gemm" times ops::linear_fp8 alone on operands
//               quantised beforehand, "gemm+casts" adds the casts the layer makes for it (x and
//               w for the forward, dy for dx and for dW: the model casts dy once for both, so the
//               with-casts block total counts that cast twice). The LM head has no fp8 rows: the
//               model runs it in bf16 under precision.mode = fp8. Each FP8 product accumulates
//               as precision.fp8_fast_accum says for its pass (the forward, or dx and dW), as
//               the model's layers do; the row's `accumulation` and the attribute
//               fp8_fast_accum record it.
// Each row: bench.warmup untimed runs, then the median (and min, max) of bench.steps runs timed
// with Runtime marks (CUDA events on GPU); TFLOP/s = group * 2*M*N*K / median. The block total
// per (precision, variant) sums the block's rows (LM head excluded): its TFLOP/s is the aggregate
// rate over one block's shapes. Rows go to /bench_gemm/results, totals to /bench_gemm/totals, and
// both to stdout. The CPU runs fp32 and fp8 (its exact emulation); bf16 needs CUDA.
#include "lmscale/io/config.h"
#include "lmscale/io/results.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::jobs {

int run_bench_gemm(const Config& cfg, ops::Runtime& rt, io::ResultsFile& out);

}  // namespace lmscale::jobs
