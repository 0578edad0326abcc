#pragma once
// Helpers for tests that run under mpirun: the process's MpiEnvironment, typed access to raw
// buffers, and the exact-sum test values shared by the collective tests.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lmscale/comm/mpi_environment.h"
#include "lmscale/core/dtype.h"

namespace lmscale::test {

// Set by mpi_test_main.cpp; tests built with another main (the single-process gpu label) get an
// environment made on first use.
inline comm::MpiEnvironment*& mpi_env_slot() {
  static comm::MpiEnvironment* env = nullptr;
  return env;
}
inline comm::MpiEnvironment& mpi_env() {
  auto*& p = mpi_env_slot();
  if (!p) {
    static comm::MpiEnvironment own(nullptr, nullptr);
    p = &own;
  }
  return *p;
}

// Element i of a raw buffer of type t, as a double (exact for every communicated type).
inline double get_value(DType t, const void* buf, std::size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(buf)[i];
    case DType::f64: return static_cast<const double*>(buf)[i];
    case DType::bf16: return bf16_to_float(static_cast<const bf16_t*>(buf)[i]);
    case DType::f16: return f16_to_float(static_cast<const f16_t*>(buf)[i]);
    case DType::i32: return static_cast<const std::int32_t*>(buf)[i];
    case DType::i64: return static_cast<double>(static_cast<const std::int64_t*>(buf)[i]);
    default: return 0;
  }
}

// Stores v rounded to t (nearest even for the 16-bit floats, truncation for ints).
inline void set_value(DType t, void* buf, std::size_t i, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case DType::f64: static_cast<double*>(buf)[i] = v; break;
    case DType::bf16: static_cast<bf16_t*>(buf)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::f16: static_cast<f16_t*>(buf)[i] = float_to_f16(static_cast<float>(v)); break;
    case DType::i32: static_cast<std::int32_t*>(buf)[i] = static_cast<std::int32_t>(v); break;
    case DType::i64: static_cast<std::int64_t*>(buf)[i] = static_cast<std::int64_t>(v); break;
    default: break;
  }
}

// v as stored in type t and read back.
inline double round_to(DType t, double v) {
  std::uint64_t tmp = 0;
  set_value(t, &tmp, 0, v);
  return get_value(t, &tmp, 0);
}

// Small integers in [-4, 4]: sums over up to 64 ranks are exact in every type (also bf16).
inline double test_value(int rank, std::size_t i, int salt = 0) {
  return static_cast<double>(static_cast<long>((i * 7 + static_cast<std::size_t>(rank) * 3 + static_cast<std::size_t>(salt)) % 9) - 4);
}

// A host buffer of n elements of t, filled with a poison byte pattern.
struct HostBuffer {
  HostBuffer(DType t, std::size_t n) : dtype(t), count(n), bytes(std::max<std::size_t>(n, 1) * dtype_size(t), std::byte{0x7b}) {}
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  double at(std::size_t i) const { return get_value(dtype, bytes.data(), i); }
  void set(std::size_t i, double v) { set_value(dtype, bytes.data(), i, v); }
  void poison() { std::fill(bytes.begin(), bytes.end(), std::byte{0x7b}); }
  DType dtype;
  std::size_t count;
  std::vector<std::byte> bytes;
};

// Prints failures of ranks other than 0 with their rank, and after each test makes all ranks
// agree whether it failed anywhere.
class RankListener : public ::testing::EmptyTestEventListener {
 public:
  explicit RankListener(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (rank_ != 0 && r.failed())
      std::printf("[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    int failed = info.result()->Failed() ? 1 : 0, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank_ == 0 && any && !failed)
      std::printf("[  FAILED  ] %s.%s failed on another rank (see [rank N] lines)\n", info.test_suite_name(),
                  info.name());
    std::fflush(stdout);
  }

 private:
  int rank_;
};

// The body of an MPI GoogleTest main: only rank 0 prints the usual report; the exit code is the
// same on every rank (1 when any rank failed).
inline int run_mpi_tests(comm::MpiEnvironment& env, int* argc, char** argv) {
  mpi_env_slot() = &env;
  ::testing::InitGoogleTest(argc, argv);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (env.rank() != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankListener(env.rank()));
  if (env.rank() == 0)
    std::printf("mpi test: %d ranks, %s, %s\n", env.size(),
                env.thread_multiple() ? "MPI_THREAD_MULTIPLE" : "below MPI_THREAD_MULTIPLE", env.library_version().c_str());
  const int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  mpi_env_slot() = nullptr;
  return any ? 1 : 0;
}

}  // namespace lmscale::test
