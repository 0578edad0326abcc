// Check mode: calls that differ between ranks fail loudly on every rank instead of hanging or
// corrupting memory, and the communicator stays usable. Bad arguments are UsageErrors.
#include <gtest/gtest.h>

#include <vector>

#include "lmscale/comm/mpi_communicator.h"
#include "mpi_test_support.h"

namespace lmscale::comm {
namespace {

class Check : public ::testing::TestWithParam<Algo> {
 protected:
  void SetUp() override {
    MpiOptions o;
    o.algo = GetParam();
    o.check = true;
    comm_ = std::make_unique<MpiCommunicator>(test::mpi_env().world(), o);
    if (comm_->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  }
  // A matching call afterwards still works.
  void expect_usable() {
    double x = 1;
    comm_->all_reduce(&x, &x, 1, DType::f64, ReduceOp::sum);
    EXPECT_EQ(x, comm_->size());
  }
  std::unique_ptr<MpiCommunicator> comm_;
};

TEST_P(Check, DifferentCountsThrowOnEveryRank) {
  std::vector<float> buf(64, 1.0f);
  const std::size_t n = comm_->rank() == 0 ? 8 : 7;
  try {
    comm_->all_reduce(buf.data(), buf.data(), n, DType::f32, ReduceOp::sum);
    ADD_FAILURE() << "no error on rank " << comm_->rank();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("mismatch"), std::string::npos) << what;
    EXPECT_NE(what.find("count=8"), std::string::npos) << what;
    EXPECT_NE(what.find("count=7"), std::string::npos) << what;
  }
  expect_usable();
}

TEST_P(Check, DifferentDtypeOpRootOrUnevenCountsThrow) {
  std::vector<double> buf(64, 1.0);
  const bool odd = comm_->rank() == 1;
  EXPECT_THROW(comm_->all_reduce(buf.data(), buf.data(), 8, odd ? DType::i64 : DType::f64, ReduceOp::sum), Error);
  EXPECT_THROW(comm_->all_reduce(buf.data(), buf.data(), 8, DType::f64, odd ? ReduceOp::max : ReduceOp::sum), Error);
  EXPECT_THROW(comm_->broadcast(buf.data(), 8, DType::f64, odd ? 1 : 0), Error);
  std::vector<std::size_t> counts(static_cast<std::size_t>(comm_->size()), 2);
  if (odd) counts[0] = 1;
  std::vector<double> out(64);
  EXPECT_THROW(comm_->all_gather_v(buf.data(), out.data(), counts, DType::f64), Error);
  // Different kinds of collective at the same point.
  if (odd)
    EXPECT_THROW(comm_->broadcast(buf.data(), 8, DType::f64, 0), Error);
  else
    EXPECT_THROW(comm_->all_reduce(buf.data(), buf.data(), 8, DType::f64, ReduceOp::sum), Error);
  expect_usable();
}

// all_to_all_v's block sizes differ per rank by design; check mode compares each send block with
// what its receiver expects, and every rank throws alike.
TEST_P(Check, AllToAllBlockSizesArePairedUp) {
  const int n = comm_->size(), r = comm_->rank();
  std::vector<std::size_t> sc(static_cast<std::size_t>(n)), rc(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) {
    sc[static_cast<std::size_t>(q)] = static_cast<std::size_t>(r + 2 * q);   // r sends r + 2q to q
    rc[static_cast<std::size_t>(q)] = static_cast<std::size_t>(q + 2 * r);   // q sends q + 2r to r
  }
  std::vector<float> send(64, 1.0f), recv(64, 0.0f);
  comm_->all_to_all_v(send.data(), sc, recv.data(), rc, DType::f32);   // consistent: no error
  if (r == 1) rc[0] += 1;   // rank 1 expects one element more from rank 0 than it sends
  try {
    comm_->all_to_all_v(send.data(), sc, recv.data(), rc, DType::f32);
    ADD_FAILURE() << "no error on rank " << r;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("all-to-all block sizes differ"), std::string::npos) << what;
    if (r == 1) EXPECT_NE(what.find("rank 0 sends 2 elements to rank 1, which expects 3"), std::string::npos) << what;
  }
  expect_usable();
}

TEST_P(Check, AsyncMismatchSurfacesAtWait) {
  std::vector<float> buf(64, 1.0f);
  Work w = comm_->all_reduce(buf.data(), buf.data(), comm_->rank() == 0 ? 3 : 4, DType::f32, ReduceOp::sum, async_call());
  EXPECT_THROW(w.wait(), Error);
  EXPECT_THROW(w.wait(), Error);   // every wait reports it
  expect_usable();
}

INSTANTIATE_TEST_SUITE_P(Mpi, Check, ::testing::Values(Algo::library, Algo::ring, Algo::shm),
                         [](const auto& param_info) { return std::string(algo_name(param_info.param)); });

TEST(Arguments, BadCallsAreUsageErrors) {
  MpiCommunicator comm(test::mpi_env().world());
  const int p = comm.size();
  std::vector<float> a(64), b(64 * static_cast<std::size_t>(p));
  EXPECT_THROW(comm.broadcast(a.data(), 4, DType::f32, p), UsageError);
  EXPECT_THROW(comm.broadcast(a.data(), 4, DType::f32, -1), UsageError);
  EXPECT_THROW(comm.send(a.data(), 4, DType::f32, p, 0), UsageError);
  EXPECT_THROW(comm.send(a.data(), 4, DType::f32, 0, -3), UsageError);
  EXPECT_THROW(comm.all_reduce(a.data(), a.data(), 4, DType::u8, ReduceOp::sum), UsageError);
  EXPECT_THROW(comm.all_reduce(a.data(), a.data() + 1, 4, DType::f32, ReduceOp::sum), UsageError);   // overlap
  EXPECT_THROW(comm.all_reduce(nullptr, a.data(), 4, DType::f32, ReduceOp::sum), UsageError);
  EXPECT_THROW(comm.all_gather_v(a.data(), b.data(), {1, 2, 3, 4, 5}, DType::f32), UsageError);
  EXPECT_NO_THROW(comm.set_algo(Algo::ring));
}

TEST(Arguments, TensorsMustMatch) {
  MpiCommunicator comm(test::mpi_env().world());
  std::vector<float> a(12, 1.0f), b(12);
  Tensor ta = Tensor::view(a.data(), {3, 4}, DType::f32, Device::cpu);
  Tensor tb = Tensor::view(b.data(), {12}, DType::f32, Device::cpu);
  comm.all_reduce(ta, tb, ReduceOp::sum);
  EXPECT_EQ(b[5], static_cast<float>(comm.size()));
  Tensor wrong_dtype = Tensor::view(b.data(), {6}, DType::bf16, Device::cpu);
  EXPECT_THROW(comm.all_reduce(ta, wrong_dtype, ReduceOp::sum), UsageError);
  Tensor on_gpu = Tensor::view(b.data(), {12}, DType::f32, Device::cuda);
  EXPECT_THROW(comm.all_reduce(on_gpu, ReduceOp::sum), UsageError);
  std::vector<float> gathered(12 * static_cast<std::size_t>(comm.size()));
  Tensor tg = Tensor::view(gathered.data(), {comm.size(), 12}, DType::f32, Device::cpu);
  comm.all_gather(tb, tg);
  EXPECT_EQ(gathered.back(), static_cast<float>(comm.size()));
  EXPECT_THROW(comm.all_gather(tg, tb), UsageError);
}

}  // namespace
}  // namespace lmscale::comm
