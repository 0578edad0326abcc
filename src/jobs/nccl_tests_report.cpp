#include "lmscale/jobs/nccl_tests_report.h"

#include <fmt/printf.h>

namespace lmscale::jobs {

namespace {
// BenchTime: the time column keeps 7 characters, fewer decimals for longer times.
std::string time_text(double us) {
  if (us >= 10000.0) return fmt::sprintf("%7.0f", us);
  if (us >= 100.0) return fmt::sprintf("%7.1f", us);
  return fmt::sprintf("%7.2f", us);
}
std::string result_text(const NcclTestsResult& r) {
  return fmt::sprintf("  %7s  %6.2f  %6.2f  %5li", time_text(r.time_us), r.algbw, r.busbw, static_cast<long>(r.wrong));
}
}  // namespace

std::string nccl_tests_preamble(std::int64_t min_bytes, std::int64_t max_bytes, std::int64_t factor,
                                std::int64_t warmup, std::int64_t iters, bool check) {
  return fmt::sprintf("# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg "
                      "iters: %d validation: %d graph: %d\n#\n# Using devices\n",
                      1, 1, static_cast<long>(min_bytes), static_cast<long>(max_bytes), static_cast<long>(factor),
                      "factor", static_cast<int>(warmup), static_cast<int>(iters), 1, check ? 1 : 0, 0);
}

std::string nccl_tests_rank_line(int rank, int pid, const std::string& host, int device, int bus_id,
                                 const std::string& device_name) {
  return fmt::sprintf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s\n", rank, 0, pid, host, device,
                      bus_id, device_name);
}

std::string nccl_tests_header() {
  return fmt::sprintf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n",
                      "", "", "", "", "") +
         fmt::sprintf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type",
                      "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong") +
         fmt::sprintf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "",
                      "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

std::string nccl_tests_row(std::int64_t bytes, std::int64_t count, DType type, CollectiveOp op,
                           const NcclTestsResult& out_of_place, const NcclTestsResult& in_place) {
  return fmt::sprintf("%12li  %12li  %8s  %6s  %6i", static_cast<long>(bytes), static_cast<long>(count),
                      nccl_tests_type(type), nccl_tests_redop(op), nccl_tests_root(op)) +
         result_text(out_of_place) + result_text(in_place) + "\n";
}

std::string nccl_tests_summary(int results_with_errors, double avg_busbw) {
  return fmt::sprintf("# Out of bounds values : %d %s\n", results_with_errors, results_with_errors ? "FAILED" : "OK") +
         fmt::sprintf("# Avg bus bandwidth    : %g %s\n", avg_busbw, "") + "#\n";
}

std::string nccl_tests_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::f16: return "half";
    case DType::bf16: return "bfloat16";
    default: return dtype_name(t);
  }
}

std::string nccl_tests_redop(CollectiveOp op) {
  return op == CollectiveOp::all_reduce || op == CollectiveOp::reduce_scatter ? "sum" : "none";
}

int nccl_tests_root(CollectiveOp op) { return op == CollectiveOp::broadcast ? 0 : -1; }

std::int64_t nccl_tests_count(CollectiveOp op, std::int64_t whole_count, int ranks) {
  // nccl-tests prints its paramcount: per rank for all-gather, reduce-scatter and alltoall.
  return op == CollectiveOp::all_gather || op == CollectiveOp::reduce_scatter || op == CollectiveOp::all_to_all
             ? whole_count / ranks
             : whole_count;
}

}  // namespace lmscale::jobs
