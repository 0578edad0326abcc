// Every collective x dtype x algorithm of the mpi backend, on 2, 3 and 4 ranks (ctest registers
// each count): sizes 0, 1, 7 (not divisible by the rank count), 1000 and 1<<16, in place and out
// of place, sum/avg/max, even and uneven splits. Inputs are small integers, so every correct
// result is exact and compared bit for bit; outputs start poisoned.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "lmscale/comm/mpi_communicator.h"
#include "collective_expectations.h"
#include "mpi_test_support.h"

namespace lmscale::comm {
namespace {

using test::expected_reduce;
using test::HostBuffer;
using test::Mismatches;
using test::offset_of;
using test::uneven_counts;
using test::round_to;
using test::test_value;

const std::size_t kSizes[] = {0, 1, 7, 1000, 1 << 16};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};

class Collectives : public ::testing::TestWithParam<std::tuple<Algo, DType>> {
 protected:
  void SetUp() override {
    MpiOptions o;
    o.algo = std::get<0>(GetParam());
    o.check = true;
    o.shm_chunk_bytes = 1000;   // many chunks even for small messages, odd element counts per chunk
    o.shm_threads = 1;
    comm_ = std::make_unique<MpiCommunicator>(test::mpi_env().world(), o);
    p_ = comm_->size();
    r_ = comm_->rank();
  }
  DType dtype() const { return std::get<1>(GetParam()); }
  std::string where(const char* op, std::size_t n, bool in_place, const char* extra = "") const {
    return fmt::format("{} n={} {} {} rank {}/{} {}", op, n, in_place ? "in-place" : "out-of-place",
                       dtype_name(dtype()), r_, p_, extra);
  }
  std::unique_ptr<MpiCommunicator> comm_;
  int p_ = 1, r_ = 0;
};

TEST_P(Collectives, AllReduce) {
  const DType t = dtype();
  for (std::size_t n : kSizes)
    for (ReduceOp op : kOps)
      for (bool in_place : {false, true}) {
        HostBuffer send(t, n), recv(t, n);
        for (std::size_t i = 0; i < n; ++i) send.set(i, test_value(r_, i));
        HostBuffer& out = in_place ? send : recv;
        comm_->all_reduce(send.data(), out.data(), n, t, op);
        Mismatches m;
        for (std::size_t i = 0; i < n; ++i) m.expect(out.at(i), expected_reduce(t, op, p_, i), i);
        EXPECT_EQ(m.wrong, 0u) << where("all-reduce", n, in_place, reduce_op_name(op)) << ": " << m.first;
        if (!in_place) {
          Mismatches s;
          for (std::size_t i = 0; i < n; ++i) s.expect(send.at(i), round_to(t, test_value(r_, i)), i);
          EXPECT_EQ(s.wrong, 0u) << "send buffer modified: " << s.first;
        }
      }
}

// all_reduce_group (the default: each tensor's all-reduce in turn): every tensor summed as alone.
TEST_P(Collectives, AllReduceGroup) {
  const DType t = dtype();
  std::vector<HostBuffer> bufs;
  std::vector<Tensor> views;
  for (std::size_t k = 0; k < std::size(kSizes); ++k) {
    bufs.emplace_back(t, kSizes[k]);
    for (std::size_t i = 0; i < kSizes[k]; ++i) bufs.back().set(i, test_value(r_, i, static_cast<int>(k)));
  }
  for (std::size_t k = 0; k < bufs.size(); ++k)
    views.push_back(Tensor::view(bufs[k].data(), {static_cast<std::int64_t>(kSizes[k])}, t, Device::cpu));
  comm_->all_reduce_group(views, ReduceOp::sum, CallOptions{true, std::nullopt}).wait();
  for (std::size_t k = 0; k < bufs.size(); ++k) {
    Mismatches m;
    for (std::size_t i = 0; i < kSizes[k]; ++i)
      m.expect(bufs[k].at(i), expected_reduce(t, ReduceOp::sum, p_, i, static_cast<int>(k)), i);
    EXPECT_EQ(m.wrong, 0u) << where("all-reduce group", kSizes[k], true) << ": " << m.first;
  }
  EXPECT_FALSE(comm_->all_reduce_group({}, ReduceOp::sum).valid());
}

TEST_P(Collectives, ReduceScatter) {
  const DType t = dtype();
  const std::size_t es = dtype_size(t);
  for (std::size_t n : kSizes)
    for (ReduceOp op : kOps)
      for (bool in_place : {false, true}) {
        const std::size_t total = n * static_cast<std::size_t>(p_);
        HostBuffer send(t, total), recv(t, n);
        for (std::size_t j = 0; j < total; ++j) send.set(j, test_value(r_, j));
        void* out = in_place ? static_cast<char*>(send.data()) + static_cast<std::size_t>(r_) * n * es : recv.data();
        comm_->reduce_scatter(send.data(), out, n, t, op);
        Mismatches m;
        for (std::size_t i = 0; i < n; ++i)
          m.expect(test::get_value(t, out, i), expected_reduce(t, op, p_, static_cast<std::size_t>(r_) * n + i), i);
        EXPECT_EQ(m.wrong, 0u) << where("reduce-scatter", n, in_place, reduce_op_name(op)) << ": " << m.first;
      }
}

TEST_P(Collectives, ReduceScatterUneven) {
  const DType t = dtype();
  const std::size_t es = dtype_size(t);
  for (std::size_t n : kSizes)
    for (ReduceOp op : kOps)
      for (bool in_place : {false, true}) {
        const auto counts = uneven_counts(n, p_);
        const std::size_t total = offset_of(counts, p_), off = offset_of(counts, r_), mine = counts[static_cast<std::size_t>(r_)];
        HostBuffer send(t, total), recv(t, mine);
        for (std::size_t j = 0; j < total; ++j) send.set(j, test_value(r_, j, 1));
        void* out = in_place ? static_cast<char*>(send.data()) + off * es : recv.data();
        comm_->reduce_scatter_v(send.data(), out, counts, t, op);
        Mismatches m;
        for (std::size_t i = 0; i < mine; ++i) m.expect(test::get_value(t, out, i), expected_reduce(t, op, p_, off + i, 1), i);
        EXPECT_EQ(m.wrong, 0u) << where("reduce-scatter-v", n, in_place, reduce_op_name(op)) << ": " << m.first;
      }
}

TEST_P(Collectives, AllGather) {
  const DType t = dtype();
  const std::size_t es = dtype_size(t);
  for (std::size_t n : kSizes)
    for (bool in_place : {false, true}) {
      const std::size_t total = n * static_cast<std::size_t>(p_);
      HostBuffer send(t, n), recv(t, total);
      char* mine = static_cast<char*>(recv.data()) + static_cast<std::size_t>(r_) * n * es;
      void* src = in_place ? static_cast<void*>(mine) : send.data();
      for (std::size_t i = 0; i < n; ++i) test::set_value(t, src, i, test_value(r_, i, 2));
      comm_->all_gather(src, recv.data(), n, t);
      Mismatches m;
      for (int q = 0; q < p_; ++q)
        for (std::size_t i = 0; i < n; ++i) m.expect(recv.at(static_cast<std::size_t>(q) * n + i), round_to(t, test_value(q, i, 2)), i);
      EXPECT_EQ(m.wrong, 0u) << where("all-gather", n, in_place) << ": " << m.first;
    }
}

TEST_P(Collectives, AllGatherUneven) {
  const DType t = dtype();
  const std::size_t es = dtype_size(t);
  for (std::size_t n : kSizes)
    for (bool in_place : {false, true}) {
      const auto counts = uneven_counts(n, p_);
      const std::size_t total = offset_of(counts, p_), off = offset_of(counts, r_), cnt = counts[static_cast<std::size_t>(r_)];
      HostBuffer send(t, cnt), recv(t, total);
      void* src = in_place ? static_cast<void*>(static_cast<char*>(recv.data()) + off * es) : send.data();
      for (std::size_t i = 0; i < cnt; ++i) test::set_value(t, src, i, test_value(r_, i, 3));
      comm_->all_gather_v(src, recv.data(), counts, t);
      Mismatches m;
      for (int q = 0; q < p_; ++q)
        for (std::size_t i = 0; i < counts[static_cast<std::size_t>(q)]; ++i)
          m.expect(recv.at(offset_of(counts, q) + i), round_to(t, test_value(q, i, 3)), i);
      EXPECT_EQ(m.wrong, 0u) << where("all-gather-v", n, in_place) << ": " << m.first;
    }
}

// Block r of rank q's send holds test_value(q, r * 1000 + i): the receiver knows each element's
// sender and its own position. Even blocks (every algo falls back to MPI_Alltoallv) and uneven
// ones, empty blocks included (n = 0, and the counts of uneven_counts(0) start at 0).
TEST_P(Collectives, AllToAll) {
  const DType t = dtype();
  for (std::size_t n : kSizes) {
    if (n > 1000) continue;   // p x p blocks
    for (bool uneven : {false, true}) {
      // Rank q sends counts(q)[r] elements to rank r.
      auto counts = [&](int q) {
        std::vector<std::size_t> c(static_cast<std::size_t>(p_), n);
        if (uneven)
          for (int r = 0; r < p_; ++r) c[static_cast<std::size_t>(r)] = n + static_cast<std::size_t>((q * 3 + r * 2) % 5);
        return c;
      };
      const auto sc = counts(r_);
      std::vector<std::size_t> rc;
      for (int q = 0; q < p_; ++q) rc.push_back(counts(q)[static_cast<std::size_t>(r_)]);
      HostBuffer send(t, offset_of(sc, p_)), recv(t, offset_of(rc, p_));
      for (int r = 0; r < p_; ++r)
        for (std::size_t i = 0; i < sc[static_cast<std::size_t>(r)]; ++i)
          test::set_value(t, send.data(), offset_of(sc, r) + i, test_value(r_, static_cast<std::size_t>(r) * 1000 + i, 2));
      if (uneven) comm_->all_to_all_v(send.data(), sc, recv.data(), rc, t);
      else comm_->all_to_all(send.data(), recv.data(), n, t);
      Mismatches m;
      for (int q = 0; q < p_; ++q)
        for (std::size_t i = 0; i < rc[static_cast<std::size_t>(q)]; ++i)
          m.expect(recv.at(offset_of(rc, q) + i), round_to(t, test_value(q, static_cast<std::size_t>(r_) * 1000 + i, 2)), i);
      EXPECT_EQ(m.wrong, 0u) << where(uneven ? "all-to-all-v" : "all-to-all", n, false) << ": " << m.first;
    }
  }
}

TEST_P(Collectives, Broadcast) {
  const DType t = dtype();
  for (std::size_t n : kSizes)
    for (int root : {0, p_ - 1}) {
      HostBuffer buf(t, n);
      if (r_ == root)
        for (std::size_t i = 0; i < n; ++i) buf.set(i, test_value(root, i, 5));
      comm_->broadcast(buf.data(), n, t, root);
      Mismatches m;
      for (std::size_t i = 0; i < n; ++i) m.expect(buf.at(i), round_to(t, test_value(root, i, 5)), i);
      EXPECT_EQ(m.wrong, 0u) << where("broadcast", n, true, fmt::format("root {}", root).c_str()) << ": " << m.first;
    }
}

// 16-bit sums are accumulated in fp32 and rounded once: 256 + 1 + 1 + 1 is 260 in bf16 (259
// rounds to even), while rounding after every addition would give 256.
TEST_P(Collectives, SixteenBitAccumulatesInFp32) {
  const DType t = dtype();
  if (t != DType::bf16 && t != DType::f16) GTEST_SKIP() << "16-bit types only";
  const double big = t == DType::bf16 ? 256 : 2048;
  const std::size_t n = 37;
  HostBuffer buf(t, n);
  for (std::size_t i = 0; i < n; ++i) buf.set(i, r_ == 0 ? big : 1.0);
  comm_->all_reduce(buf.data(), buf.data(), n, t, ReduceOp::sum);
  const double want = round_to(t, big + (p_ - 1));
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(buf.at(i), want) << "element " << i << " rank " << r_;
}

INSTANTIATE_TEST_SUITE_P(Mpi, Collectives,
                         ::testing::Combine(::testing::Values(Algo::library, Algo::ring, Algo::shm),
                                            ::testing::Values(DType::f32, DType::f64, DType::bf16, DType::f16,
                                                              DType::i32, DType::i64)),
                         [](const auto& param_info) {
                           return fmt::format("{}_{}", algo_name(std::get<0>(param_info.param)),
                                              dtype_name(std::get<1>(param_info.param)));
                         });

// ---- algorithms agree on inexact data; big messages through the threaded shm path -----------

template <class T>
std::vector<T> random_values(std::size_t n, int rank) {
  std::mt19937_64 g(1234 + static_cast<unsigned>(rank));
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(u(g));
  return v;
}

TEST(Algorithms, RingShmAndLibraryAgreeOnRandomData) {
  auto& env = test::mpi_env();
  MpiOptions o;
  o.check = true;
  MpiCommunicator comm(env.world(), o);
  const std::size_t n = 100003;
  const auto in64 = random_values<double>(n, comm.rank());
  const auto in32 = random_values<float>(n, comm.rank());
  std::vector<double> lib64(n), ring64(n), shm64(n);
  std::vector<float> lib32(n), ring32(n), shm32(n);
  comm.all_reduce(in64.data(), lib64.data(), n, DType::f64, ReduceOp::sum, {false, Algo::library});
  comm.all_reduce(in64.data(), ring64.data(), n, DType::f64, ReduceOp::sum, {false, Algo::ring});
  comm.all_reduce(in64.data(), shm64.data(), n, DType::f64, ReduceOp::sum, {false, Algo::shm});
  comm.all_reduce(in32.data(), lib32.data(), n, DType::f32, ReduceOp::avg, {false, Algo::library});
  comm.all_reduce(in32.data(), ring32.data(), n, DType::f32, ReduceOp::avg, {false, Algo::ring});
  comm.all_reduce(in32.data(), shm32.data(), n, DType::f32, ReduceOp::avg, {false, Algo::shm});
  double worst64 = 0, worst32 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst64 = std::max({worst64, std::abs(ring64[i] - lib64[i]), std::abs(shm64[i] - lib64[i])});
    worst32 = std::max({worst32, static_cast<double>(std::abs(ring32[i] - lib32[i])),
                        static_cast<double>(std::abs(shm32[i] - lib32[i]))});
  }
  // Only the summation order differs: a few ulps of a sum of |x| <= size.
  EXPECT_LT(worst64, 1e-14 * comm.size());
  EXPECT_LT(worst32, 1e-6);
  // Every rank holds the same result (for each algorithm the reduction order is rank-independent
  // for library and shm; the ring's last all-gather copies one owner's block to all).
  double mine = 0;
  for (std::size_t i = 0; i < n; i += 997) mine += ring64[i] + shm64[i];
  double lo = 0, hi = 0;
  MPI_Allreduce(&mine, &lo, 1, MPI_DOUBLE, MPI_MIN, env.world());
  MPI_Allreduce(&mine, &hi, 1, MPI_DOUBLE, MPI_MAX, env.world());
  EXPECT_EQ(lo, hi);
}

TEST(Algorithms, ShmThreadedLargeMessages) {
  MpiOptions o;
  o.algo = Algo::shm;
  o.check = true;
  o.shm_threads = 3;
  o.shm_chunk_bytes = std::size_t{1} << 20;   // 1 MiB: several chunks below, each split over threads
  MpiCommunicator comm(test::mpi_env().world(), o);
  const int p = comm.size(), r = comm.rank();
  for (DType t : {DType::f32, DType::bf16}) {
    const std::size_t n = (std::size_t{3} << 18) + 5;
    HostBuffer send(t, n * static_cast<std::size_t>(p)), recv(t, n * static_cast<std::size_t>(p));
    for (std::size_t j = 0; j < n * static_cast<std::size_t>(p); ++j) send.set(j, test_value(r, j));
    comm.all_reduce(send.data(), recv.data(), n * static_cast<std::size_t>(p), t, ReduceOp::sum);
    Mismatches m;
    for (std::size_t j = 0; j < n * static_cast<std::size_t>(p); ++j) m.expect(recv.at(j), expected_reduce(t, ReduceOp::sum, p, j), j);
    EXPECT_EQ(m.wrong, 0u) << "all-reduce " << dtype_name(t) << ": " << m.first;
    recv.poison();
    comm.reduce_scatter(send.data(), recv.data(), n, t, ReduceOp::max);
    Mismatches rs;
    for (std::size_t i = 0; i < n; ++i)
      rs.expect(recv.at(i), expected_reduce(t, ReduceOp::max, p, static_cast<std::size_t>(r) * n + i), i);
    EXPECT_EQ(rs.wrong, 0u) << "reduce-scatter " << dtype_name(t) << ": " << rs.first;
    recv.poison();
    comm.all_gather(send.data(), recv.data(), n, t);
    Mismatches ag;
    for (int q = 0; q < p; ++q)
      for (std::size_t i = 0; i < n; ++i) ag.expect(recv.at(static_cast<std::size_t>(q) * n + i), round_to(t, test_value(q, i)), i);
    EXPECT_EQ(ag.wrong, 0u) << "all-gather " << dtype_name(t) << ": " << ag.first;
  }
}

TEST(Algorithms, AutoPicksAWorkingAlgorithmForSmallAndLargeMessages) {
  MpiCommunicator comm(test::mpi_env().world());   // default options: algo auto
  EXPECT_EQ(comm.algo(), Algo::automatic);
  for (std::size_t n : {std::size_t{5}, std::size_t{1} << 18}) {
    std::vector<std::int32_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>(test_value(comm.rank(), i));
    comm.all_reduce(v.data(), v.data(), n, DType::i32, ReduceOp::sum);
    Mismatches m;
    for (std::size_t i = 0; i < n; ++i) m.expect(v[i], expected_reduce(DType::i32, ReduceOp::sum, comm.size(), i), i);
    EXPECT_EQ(m.wrong, 0u) << "n=" << n << ": " << m.first;
  }
}

// FP8 and uint8 are moved, never reduced (fsdp's FP8 weight gathers, parallel/fsdp.h): every
// algorithm all-gathers them byte for byte (odd sizes, every byte value, in place and not) and a
// reduction of one is refused.
TEST(Algorithms, ByteTypesAreGatheredNotReduced) {
  for (Algo a : {Algo::library, Algo::ring, Algo::shm})
    for (DType t : {DType::e4m3, DType::e5m2, DType::u8}) {
      MpiOptions o;
      o.algo = a;
      o.shm_chunk_bytes = 1000;
      o.shm_threads = 1;
      MpiCommunicator comm(test::mpi_env().world(), o);
      const int p = comm.size(), r = comm.rank();
      for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4099}})
        for (bool in_place : {false, true}) {
          auto byte = [](int q, std::size_t i) { return static_cast<std::uint8_t>((q * 131 + i * 7) & 0xFF); };
          std::vector<std::uint8_t> send(n), recv(n * static_cast<std::size_t>(p), 0xAA);
          std::uint8_t* mine = recv.data() + static_cast<std::size_t>(r) * n;
          std::uint8_t* src = in_place ? mine : send.data();
          for (std::size_t i = 0; i < n; ++i) src[i] = byte(r, i);
          comm.all_gather(src, recv.data(), n, t);
          std::size_t wrong = 0;
          for (int q = 0; q < p; ++q)
            for (std::size_t i = 0; i < n; ++i) wrong += recv[static_cast<std::size_t>(q) * n + i] != byte(q, i);
          EXPECT_EQ(wrong, 0u) << algo_name(a) << " " << dtype_name(t) << " n=" << n << (in_place ? " in place" : "");
        }
      std::vector<std::uint8_t> buf(8, 1);
      EXPECT_THROW(comm.all_reduce(buf.data(), buf.data(), 8, t, ReduceOp::max), UsageError) << dtype_name(t);
      std::vector<std::uint8_t> one(1);   // send: p <= 8 blocks of 1
      EXPECT_THROW(comm.reduce_scatter(buf.data(), one.data(), 1, t, ReduceOp::sum), UsageError) << dtype_name(t);
    }
}

// The path record behind /system/comm_paths and bench-collectives' path column: under mpirun
// every rank is on this node, so auto takes shm for large messages and library (node) for small
// ones, and hier (asked for explicitly) is shm here; hier itself crosses nodes only in the
// two-node Slurm test (ctest/slurm/run_multi_node_test.sh), which checks its results.
TEST(Algorithms, PathsAreRecordedPerCall) {
  MpiCommunicator comm(test::mpi_env().world());
  ASSERT_TRUE(comm.node_local());
  EXPECT_EQ(comm.nodes(), 1);
  std::vector<float> big(std::size_t{1} << 16, 1.0f), small(4, 1.0f);
  comm.all_reduce(big.data(), big.data(), big.size(), DType::f32, ReduceOp::sum);
  comm.all_reduce(small.data(), small.data(), small.size(), DType::f32, ReduceOp::sum);
  comm.all_reduce(small.data(), small.data(), small.size(), DType::f32, ReduceOp::sum);
  comm.all_reduce(big.data(), big.data(), big.size(), DType::f32, ReduceOp::avg, CallOptions{false, Algo::hier});
  comm.barrier();   // not a collective for the record
  for (float x : big) ASSERT_FLOAT_EQ(x, static_cast<float>(comm.size()));
  const auto uses = comm.path_uses();
  auto calls = [&](const std::string& p) -> std::uint64_t {
    for (const auto& u : uses)
      if (u.path == p) return u.calls;
    return 0;
  };
  EXPECT_EQ(calls("shm"), 2u);
  EXPECT_EQ(calls("library-node"), 2u);
  EXPECT_EQ(uses.size(), 2u);
  for (const auto& u : uses) {
    if (u.path == "library-node") {
      EXPECT_EQ(u.bytes, 2 * small.size() * sizeof(float));
    }
  }
}

}  // namespace
}  // namespace lmscale::comm
