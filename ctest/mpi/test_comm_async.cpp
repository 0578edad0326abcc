// Asynchronous work of the mpi backend: it runs on the communication thread while the caller
// computes, in call order; point-to-point messages in any order; size mismatches of a recv fail.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <numeric>
#include <vector>

#include "lmscale/comm/mpi_communicator.h"
#include "mpi_test_support.h"

namespace lmscale::comm {
namespace {

using Clock = std::chrono::steady_clock;

// An async all-reduce of a large buffer must run while the caller keeps computing: rank 0 starts
// it while the other ranks are still held back (so it cannot be complete when the call returns:
// the call did not block), then releases them; every rank then computes without ever calling
// wait(), and the work must complete meanwhile (it progressed on the communication thread).
TEST(Async, AllReduceCompletesWhileTheCallerComputes) {
  auto& env = test::mpi_env();
  if (!env.thread_multiple()) GTEST_SKIP() << "MPI without MPI_THREAD_MULTIPLE runs work inline";
  for (Algo algo : {Algo::library, Algo::ring, Algo::shm}) {
    MpiOptions o;
    o.algo = algo;
    MpiCommunicator comm(env.world(), o);
    ASSERT_TRUE(comm.threaded());
    const std::size_t n = std::size_t{1} << 20;   // 4 MB of fp32
    std::vector<float> buf(n, static_cast<float>(comm.rank() + 1));
    comm.barrier();
    Work w;
    bool done_at_return = false;
    if (comm.rank() == 0) {
      w = comm.all_reduce(buf.data(), buf.data(), n, DType::f32, ReduceOp::sum, async_call());
      done_at_return = w.is_completed();   // cannot be: the others have not joined yet
      MPI_Barrier(env.world());            // release them
    } else {
      MPI_Barrier(env.world());
      w = comm.all_reduce(buf.data(), buf.data(), n, DType::f32, ReduceOp::sum, async_call());
    }
    const auto t0 = Clock::now();
    // Busy loop: real arithmetic on the caller's thread, polling is_completed() only.
    double acc = 0;
    long iterations = 0;
    bool completed_while_busy = false;
    while (std::chrono::duration<double>(Clock::now() - t0).count() < 60.0) {
      for (int k = 0; k < 20000; ++k) acc += std::sqrt(static_cast<double>(k + iterations));
      ++iterations;
      if (w.is_completed()) {
        completed_while_busy = true;
        break;
      }
    }
    const double busy_s = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_FALSE(done_at_return) << algo_name(algo) << ": the async call returned only after the work was done";
    EXPECT_TRUE(completed_while_busy) << algo_name(algo) << ": not completed after " << busy_s << " s of compute";
    EXPECT_GT(acc, 0);
    w.wait();
    const float want = static_cast<float>(comm.size() * (comm.size() + 1) / 2);
    std::size_t wrong = 0;
    for (float x : buf) wrong += x != want;
    EXPECT_EQ(wrong, 0u) << algo_name(algo);
  }
}

// Several async calls are executed in the order they were made, whatever order they are waited in.
TEST(Async, WorkRunsInCallOrder) {
  MpiCommunicator comm(test::mpi_env().world(), MpiOptions{Algo::ring, true});
  const std::size_t n = 1000;
  std::vector<double> a(n, comm.rank() + 1.0);
  std::vector<Work> works;
  // max (-> p), then sum (-> p^2), then sum (-> p^3). Any other order starts with a sum and ends
  // at p^2 (p+1)/2 instead.
  works.push_back(comm.all_reduce(a.data(), a.data(), n, DType::f64, ReduceOp::max, async_call()));
  works.push_back(comm.all_reduce(a.data(), a.data(), n, DType::f64, ReduceOp::sum, async_call()));
  works.push_back(comm.all_reduce(a.data(), a.data(), n, DType::f64, ReduceOp::sum, async_call()));
  for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
  for (auto& w : works) EXPECT_TRUE(w.is_completed());
  const double p = comm.size();
  for (double x : a) ASSERT_EQ(x, p * p * p);
}

// Every rank sends to its right neighbour first and receives from its left one afterwards, with a
// message large enough that a blocking send would wait for the matching receive: the mpi backend
// posts both, so this completes.
TEST(PointToPoint, SendBeforeRecvOnAllRanksDoesNotDeadlock) {
  MpiCommunicator comm(test::mpi_env().world());
  const int p = comm.size(), r = comm.rank();
  const std::size_t n = std::size_t{1} << 20;
  std::vector<std::int64_t> out(n), in(n, -1);
  std::iota(out.begin(), out.end(), std::int64_t{r} << 32);
  Work s = comm.send(out.data(), n, DType::i64, (r + 1) % p, 7, async_call());
  Work q = comm.recv(in.data(), n, DType::i64, (r + p - 1) % p, 7, async_call());
  s.wait();
  q.wait();
  const std::int64_t left = (r + p - 1) % p;
  for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(in[i], (left << 32) + static_cast<std::int64_t>(i));
}

TEST(PointToPoint, SendrecvShiftsAroundTheRing) {
  MpiCommunicator comm(test::mpi_env().world());
  const int p = comm.size(), r = comm.rank();
  std::vector<float> out(333, static_cast<float>(r)), in(333, -1);
  comm.sendrecv(out.data(), out.size(), (r + 1) % p, in.data(), in.size(), (r + p - 1) % p, DType::f32, 3);
  for (float x : in) ASSERT_EQ(x, static_cast<float>((r + p - 1) % p));
}

TEST(PointToPoint, TagsKeepMessagesApart) {
  MpiCommunicator comm(test::mpi_env().world());
  if (comm.size() < 2) GTEST_SKIP();
  const int r = comm.rank();
  if (r == 0) {
    std::vector<std::int32_t> a(10, 1), b(10, 2);
    Work w1 = comm.send(a.data(), a.size(), DType::i32, 1, 1, async_call());
    Work w2 = comm.send(b.data(), b.size(), DType::i32, 1, 2, async_call());
    w1.wait();
    w2.wait();
  } else if (r == 1) {
    std::vector<std::int32_t> a(10, 0), b(10, 0);
    comm.recv(b.data(), b.size(), DType::i32, 0, 2);   // the second message first
    comm.recv(a.data(), a.size(), DType::i32, 0, 1);
    EXPECT_EQ(a[3], 1);
    EXPECT_EQ(b[3], 2);
  }
  comm.barrier();
}

// A recv whose message has another size throws on the receiving rank (shorter and longer).
TEST(PointToPoint, SizeMismatchThrows) {
  MpiCommunicator comm(test::mpi_env().world());
  if (comm.size() < 2) GTEST_SKIP();
  const int r = comm.rank();
  std::vector<float> buf(16, 0);
  if (r == 0) {
    comm.send(buf.data(), 10, DType::f32, 1, 5);
    comm.send(buf.data(), 16, DType::f32, 1, 6);
  } else if (r == 1) {
    EXPECT_THROW(comm.recv(buf.data(), 12, DType::f32, 0, 5), Error);   // message shorter than expected
    EXPECT_THROW(comm.recv(buf.data(), 8, DType::f32, 0, 6), Error);    // longer: truncated
  }
  comm.barrier();
  // The communicator is still usable afterwards.
  double x = 1;
  comm.all_reduce(&x, &x, 1, DType::f64, ReduceOp::sum);
  EXPECT_EQ(x, comm.size());
}

// With async=false the call has completed when it returns.
TEST(Async, SynchronousCallsAreComplete) {
  MpiCommunicator comm(test::mpi_env().world());
  std::vector<float> v(1 << 16, 1.0f);
  Work w = comm.all_reduce(v.data(), v.data(), v.size(), DType::f32, ReduceOp::sum);
  EXPECT_TRUE(w.is_completed());
  EXPECT_EQ(v[123], static_cast<float>(comm.size()));
}

}  // namespace
}  // namespace lmscale::comm
