#pragma once
// Job `bench-collectives` (docs/architecture.md §5, docs/collectives.md): the bandwidth of all-reduce,
// reduce-scatter, all-gather and broadcast on the deck's backend (parallel.backend: mpi on host
// memory, nccl on GPUs) and algorithm (bench.algo), swept over sizes as nccl-tests does
// (bench.min_bytes, bench.min_bytes*bench.step_factor, ... <= bench.max_bytes) and bench.dtypes.
//
// Per (op, dtype, size): with bench.check, one call on exact test values (small integers) in check
// mode, verified element by element on every rank (#wrong summed over ranks; any wrong element
// makes the row FAIL and the job exit 1 after writing); then bench.warmup untimed calls, a
// barrier, and bench.steps calls launched back to back and timed (CUDA events on the compute
// stream for nccl, wall clock for mpi). Time per call per rank -> avg/min/max over ranks.
// algbw = bytes / avg time; busbw = algbw * factor (nccl-tests: all-reduce 2(n-1)/n,
// reduce-scatter and all-gather (n-1)/n, broadcast 1), where bytes is the whole buffer
// (all-reduce/broadcast: the buffer; reduce-scatter: the send buffer; all-gather: the receive
// buffer; counts rounded down to a multiple of the rank count for the last two).
// Rows: stdout table (rank 0) and HDF5 /bench_collectives/results.
#include <cstdint>
#include <string>
#include <vector>

#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {

int run_bench_collectives(JobEnv& env);

// Seconds per call of `op` over `c` on this rank, timed as the sweep times each size (bench.warmup
// calls, a barrier, `steps` calls back to back; CUDA events on the compute stream when
// `on_device`); buffers of `bytes` (fp32 elements) at send and recv. The calibrate job's
// collective measurements (jobs/plan/calibrate_job.h).
double time_collective(comm::Communicator& c, ops::Runtime& rt, bool on_device, CollectiveOp op, void* send, void* recv,
                       std::size_t bytes, std::int64_t warmup, std::int64_t steps);

// nccl-tests' bus-bandwidth factor of `op` ("all-reduce", ...) on `ranks` ranks.
double busbw_factor(CollectiveOp op, int ranks);
// min, min*factor, min*factor^2, ... while <= max (UsageError for min < 1, max < min, factor < 2).
std::vector<std::int64_t> sweep_sizes(std::int64_t min_bytes, std::int64_t max_bytes, std::int64_t factor);

}  // namespace lmscale::jobs
