#pragma once
// Job `bench-attention` (docs/architecture.md §5): naive vs flash attention, forward / backward /
// forward-backward, swept over the cartesian product of bench.impls, bench.passes, bench.dtypes,
// bench.causal, bench.attn_batch, bench.attn_heads, bench.seq_lens and bench.head_dims.
// Each case: bench.warmup untimed runs, then the median (and min, max) of bench.steps runs timed
// with Runtime marks (CUDA events on GPU); bytes in use before the backward; a case that runs out
// of memory is recorded with status "OOM" and the sweep goes on. Rows go to the HDF5 table
// /bench_attention/results and to a table on stdout. Layout [B, H, T, D]; inputs are random
// normals. FLOPs: forward 4*B*H*T*T*D (halved when causal), backward 2.5x forward,
// forward-backward 3.5x forward (docs/attention.md).
#include "lmscale/io/config.h"
#include "lmscale/io/results.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::jobs {

int run_bench_attention(const Config& cfg, ops::Runtime& rt, io::ResultsFile& out);

// The FLOP count the job reports TFLOP/s with, for one pass ("forward", "backward",
// "forward-backward") of one attention call.
double attention_flops(AttentionPass pass, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                       std::int64_t head_dim, bool causal);

}  // namespace lmscale::jobs
