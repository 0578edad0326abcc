#pragma once
// What a correct collective produces from the exact test values (mpi_test_support.h), shared by
// the mpi-backend and nccl-backend tests.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lmscale/comm/types.h"
#include "mpi_test_support.h"

namespace lmscale::test {

inline bool is_int(DType t) { return t == DType::i32 || t == DType::i64; }

// The exact result of reducing test_value(r, i, salt) over ranks r < p: avg is the sum divided in
// the accumulation precision (fp32 for 16-bit types), ints truncating toward zero.
inline double expected_reduce(DType t, comm::ReduceOp op, int p, std::size_t i, int salt = 0) {
  double s = 0, m = -std::numeric_limits<double>::infinity();
  for (int r = 0; r < p; ++r) {
    const double v = test_value(r, i, salt);
    s += v;
    m = std::max(m, v);
  }
  switch (op) {
    case comm::ReduceOp::sum: return round_to(t, s);
    case comm::ReduceOp::max: return round_to(t, m);
    case comm::ReduceOp::avg:
      if (is_int(t)) return static_cast<double>(static_cast<long long>(s) / p);
      if (t == DType::f64) return s / p;
      return round_to(t, static_cast<double>(static_cast<float>(s) / static_cast<float>(p)));
  }
  return 0;
}

// Uneven per-rank counts around n (some zero when n is 0).
inline std::vector<std::size_t> uneven_counts(std::size_t n, int p) {
  std::vector<std::size_t> c;
  for (int q = 0; q < p; ++q) c.push_back(n + static_cast<std::size_t>((q * 3) % 5));
  return c;
}

inline std::size_t offset_of(const std::vector<std::size_t>& c, int r) {
  std::size_t o = 0;
  for (int q = 0; q < r; ++q) o += c[static_cast<std::size_t>(q)];
  return o;
}

// Counts wrong elements and remembers the first one.
struct Mismatches {
  std::size_t wrong = 0;
  std::string first;
  void expect(double got, double want, std::size_t i) {
    if (got == want || (std::isnan(got) && std::isnan(want))) return;
    if (wrong++ == 0) first = fmt::format("element {}: got {} want {}", i, got, want);
  }
};

}  // namespace lmscale::test
