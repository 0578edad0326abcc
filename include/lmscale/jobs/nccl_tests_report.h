#pragma once
// bench.format = nccl-tests: bench-collectives' stdout in the layout of NVIDIA's nccl-tests
// (its src/common.cu: the Reporter's header, parameters and result columns, BenchTime's time
// format, run()'s preamble and summary), so that the parsers written for nccl-tests read lmscale's
// tables: rows of 13 whitespace-separated fields
//   size(B) count type redop root | time(us) algbw busbw #wrong (out-of-place) | the same in place
// and a "# Avg bus bandwidth    : X " line per table (the mean busbw of its rows, both placements).
#include <cstdint>
#include <string>

#include "lmscale/core/dtype.h"
#include "lmscale/io/config.h"

namespace lmscale::jobs {

struct NcclTestsResult {
  double time_us = 0;      // mean over ranks of the seconds per call, in microseconds
  double algbw = 0;        // GB/s (1e9 bytes)
  double busbw = 0;        // GB/s
  std::int64_t wrong = 0;  // wrong elements over all ranks; -1 when not checked
};

// "# nThread 1 nGpus 1 minBytes ... graph: 0", "#", "# Using devices" (the rank lines follow).
std::string nccl_tests_preamble(std::int64_t min_bytes, std::int64_t max_bytes, std::int64_t factor,
                                std::int64_t warmup, std::int64_t iters, bool check);
// "#  Rank  0 Group  0 Pid   1234 on   hostname device  0 [0x00] NVIDIA H100 80GB HBM3"
std::string nccl_tests_rank_line(int rank, int pid, const std::string& host, int device, int bus_id,
                                 const std::string& device_name);
// The three header lines (placements, column names, units).
std::string nccl_tests_header();
// One row: the collective's parameters, then the out-of-place and in-place results.
std::string nccl_tests_row(std::int64_t bytes, std::int64_t count, DType type, CollectiveOp op,
                           const NcclTestsResult& out_of_place, const NcclTestsResult& in_place);
// "# Out of bounds values : N OK|FAILED", "# Avg bus bandwidth    : X ", "#".
std::string nccl_tests_summary(int results_with_errors, double avg_busbw);

// nccl-tests' names: float, double, half, bfloat16; sum or none (no reduction); root -1 (none) or 0.
std::string nccl_tests_type(DType t);
std::string nccl_tests_redop(CollectiveOp op);
int nccl_tests_root(CollectiveOp op);
// The count column: elements per rank's call argument (all-gather: send count; reduce-scatter:
// receive count; all-reduce and broadcast: the whole buffer), as nccl-tests' paramCount.
std::int64_t nccl_tests_count(CollectiveOp op, std::int64_t whole_count, int ranks);

}  // namespace lmscale::jobs
