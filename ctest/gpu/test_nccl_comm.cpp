// The nccl backend on device buffers: every collective x dtype, sizes 0, 1, 7, 1000, 1<<16, in place
// and out of place, sum/avg/max, even and uneven splits, checked bit for bit against the exact
// test values; stream ordering (after the compute stream, wait() without blocking the host);
// split; check mode; health() of non-blocking communicators. Built twice: here with gpu_main.cpp (one process, label gpu) and in
// ctest/mpi with nccl_test_main.cpp, run as mpirun -np 2 on 2 GPUs (gpu.test_nccl_comm.np2).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "lmscale/comm/nccl_communicator.h"
#include "mpi/collective_expectations.h"
#include "mpi/mpi_test_support.h"

namespace lmscale::comm {
namespace {

using test::expected_reduce;
using test::HostBuffer;
using test::Mismatches;
using test::offset_of;
using test::round_to;
using test::test_value;
using test::uneven_counts;

const std::size_t kSizes[] = {0, 1, 7, 1000, 1 << 16};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// Device memory mirroring a HostBuffer.
struct DeviceBuffer {
  DeviceBuffer(DType t, std::size_t n) : bytes(std::max<std::size_t>(n, 1) * dtype_size(t)) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) ptr = nullptr;
    cudaMemset(ptr, 0x7b, bytes);
    cudaDeviceSynchronize();
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* data() { return static_cast<char*>(ptr); }
  void* ptr = nullptr;
  std::size_t bytes;
};

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    auto& env = test::mpi_env();
    int gpus = 0;
    ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
    ASSERT_GT(gpus, 0);
    device_ = env.local_rank() % gpus;
    CUDA_OK(cudaSetDevice(device_));
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    comm_ = make_nccl_communicator(env.world(), device_, NcclOptions{true});
    comm_->set_compute_stream(stream_);
    p_ = comm_->size();
    r_ = comm_->rank();
  }
  void TearDown() override {
    comm_.reset();
    cudaStreamDestroy(stream_);
  }
  // Host -> device on the compute stream (asynchronous: the collective must be ordered after it).
  void upload(void* dst, const HostBuffer& src, std::size_t bytes) {
    ASSERT_EQ(cudaMemcpyAsync(dst, src.data(), bytes, cudaMemcpyHostToDevice, stream_), cudaSuccess);
  }
  // Device -> host after the work, ordered by Work::wait() on the compute stream.
  void download(HostBuffer& dst, const void* src, std::size_t bytes) {
    ASSERT_EQ(cudaMemcpyAsync(dst.data(), src, bytes, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }
  std::string where(const char* op, DType t, std::size_t n, bool in_place, const char* extra = "") const {
    return fmt::format("{} {} n={} {} rank {}/{} {}", op, dtype_name(t), n, in_place ? "in-place" : "out-of-place", r_,
                       p_, extra);
  }
  bool avg_exact() const { return (p_ & (p_ - 1)) == 0; }   // ncclAvg pre-multiplies floats by 1/p

  int device_ = 0, p_ = 1, r_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Communicator> comm_;
};

const DType kTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64};

TEST_F(Nccl, AllReduceEveryTypeSizeAndOp) {
  for (DType t : kTypes)
    for (std::size_t n : kSizes)
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::avg && !avg_exact() && !test::is_int(t)) continue;
        for (bool in_place : {false, true}) {
          const std::size_t es = dtype_size(t);
          HostBuffer in(t, n), out(t, n);
          for (std::size_t i = 0; i < n; ++i) in.set(i, test_value(r_, i));
          DeviceBuffer send(t, n), recv(t, n);
          upload(send.data(), in, n * es);
          void* dst = in_place ? send.data() : recv.data();
          comm_->all_reduce(send.data(), dst, n, t, op);
          download(out, dst, n * es);
          Mismatches m;
          for (std::size_t i = 0; i < n; ++i) m.expect(out.at(i), expected_reduce(t, op, p_, i), i);
          EXPECT_EQ(m.wrong, 0u) << where("all-reduce", t, n, in_place, reduce_op_name(op)) << ": " << m.first;
        }
      }
}

// all_reduce_group: several tensors of different dtypes and sizes (one empty) in one group, each
// summed as its own all-reduce would, bit for bit; the Work orders the compute stream after all.
TEST_F(Nccl, AllReduceGroupEqualsEachAllReduce) {
  const std::vector<std::pair<DType, std::size_t>> parts = {
      {DType::f32, 1000}, {DType::bf16, 7}, {DType::f32, 0}, {DType::f64, 1 << 16}, {DType::i32, 1}};
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  std::vector<Tensor> views;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const auto [t, n] = parts[k];
    HostBuffer in(t, n);
    for (std::size_t i = 0; i < n; ++i) in.set(i, test_value(r_, i, static_cast<int>(k)));
    bufs.push_back(std::make_unique<DeviceBuffer>(t, n));
    upload(bufs.back()->data(), in, n * dtype_size(t));
    views.push_back(Tensor::view(bufs.back()->data(), {static_cast<std::int64_t>(n)}, t, Device::cuda));
  }
  comm_->all_reduce_group(views, ReduceOp::sum, CallOptions{true, std::nullopt}).wait();
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const auto [t, n] = parts[k];
    HostBuffer out(t, n);
    download(out, bufs[k]->data(), n * dtype_size(t));
    Mismatches m;
    for (std::size_t i = 0; i < n; ++i)
      m.expect(out.at(i), expected_reduce(t, ReduceOp::sum, p_, i, static_cast<int>(k)), i);
    EXPECT_EQ(m.wrong, 0u) << where("all-reduce group", t, n, true) << ": " << m.first;
  }
  EXPECT_FALSE(comm_->all_reduce_group({}, ReduceOp::sum).valid());
}

TEST_F(Nccl, ReduceScatterEvenAndUneven) {
  for (DType t : kTypes)
    for (std::size_t n : kSizes)
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::avg && !avg_exact() && !test::is_int(t)) continue;
        for (bool uneven : {false, true})
          for (bool in_place : {false, true}) {
            const std::size_t es = dtype_size(t);
            const auto counts = uneven ? uneven_counts(n, p_) : std::vector<std::size_t>(static_cast<std::size_t>(p_), n);
            const std::size_t total = offset_of(counts, p_), off = offset_of(counts, r_), mine = counts[static_cast<std::size_t>(r_)];
            HostBuffer in(t, total), out(t, mine);
            for (std::size_t j = 0; j < total; ++j) in.set(j, test_value(r_, j, 1));
            DeviceBuffer send(t, total), recv(t, mine);
            upload(send.data(), in, total * es);
            void* dst = in_place ? send.data() + off * es : recv.data();
            if (uneven)
              comm_->reduce_scatter_v(send.data(), dst, counts, t, op);
            else
              comm_->reduce_scatter(send.data(), dst, n, t, op);
            download(out, dst, mine * es);
            Mismatches m;
            for (std::size_t i = 0; i < mine; ++i) m.expect(out.at(i), expected_reduce(t, op, p_, off + i, 1), i);
            EXPECT_EQ(m.wrong, 0u) << where(uneven ? "reduce-scatter-v" : "reduce-scatter", t, n, in_place,
                                            reduce_op_name(op))
                                   << ": " << m.first;
          }
      }
}

TEST_F(Nccl, AllGatherEvenAndUnevenAndBroadcast) {
  for (DType t : kTypes)
    for (std::size_t n : kSizes) {
      const std::size_t es = dtype_size(t);
      for (bool uneven : {false, true})
        for (bool in_place : {false, true}) {
          const auto counts = uneven ? uneven_counts(n, p_) : std::vector<std::size_t>(static_cast<std::size_t>(p_), n);
          const std::size_t total = offset_of(counts, p_), off = offset_of(counts, r_), cnt = counts[static_cast<std::size_t>(r_)];
          HostBuffer in(t, cnt), out(t, total);
          for (std::size_t i = 0; i < cnt; ++i) in.set(i, test_value(r_, i, 2));
          DeviceBuffer send(t, cnt), recv(t, total);
          char* src = in_place ? recv.data() + off * es : send.data();
          upload(src, in, cnt * es);
          if (uneven)
            comm_->all_gather_v(src, recv.data(), counts, t);
          else
            comm_->all_gather(src, recv.data(), n, t);
          download(out, recv.data(), total * es);
          Mismatches m;
          for (int q = 0; q < p_; ++q)
            for (std::size_t i = 0; i < counts[static_cast<std::size_t>(q)]; ++i)
              m.expect(out.at(offset_of(counts, q) + i), round_to(t, test_value(q, i, 2)), i);
          EXPECT_EQ(m.wrong, 0u) << where(uneven ? "all-gather-v" : "all-gather", t, n, in_place) << ": " << m.first;
        }
      for (int root : {0, p_ - 1}) {
        HostBuffer in(t, n), out(t, n);
        for (std::size_t i = 0; i < n; ++i) in.set(i, test_value(root, i, 5));
        DeviceBuffer buf(t, n);
        if (r_ == root) upload(buf.data(), in, n * es);
        comm_->broadcast(buf.data(), n, t, root);
        download(out, buf.data(), n * es);
        Mismatches m;
        for (std::size_t i = 0; i < n; ++i) m.expect(out.at(i), round_to(t, test_value(root, i, 5)), i);
        EXPECT_EQ(m.wrong, 0u) << where("broadcast", t, n, true, fmt::format("root {}", root).c_str()) << ": " << m.first;
      }
    }
}

// FP8 and uint8 are moved byte for byte (fsdp's FP8 weight gathers, parallel/fsdp_fp8_gather.h)
// and never reduced.
TEST_F(Nccl, ByteTypesAreGatheredNotReduced) {
  for (DType t : {DType::e4m3, DType::e5m2, DType::u8})
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
      auto byte = [](int q, std::size_t i) { return static_cast<std::uint8_t>((q * 131 + i * 7) & 0xFF); };
      HostBuffer in(DType::u8, n), out(DType::u8, n * static_cast<std::size_t>(p_));
      auto* mine = static_cast<std::uint8_t*>(in.data());
      for (std::size_t i = 0; i < n; ++i) mine[i] = byte(r_, i);
      DeviceBuffer send(t, n), recv(t, n * static_cast<std::size_t>(p_));
      upload(send.data(), in, n);
      comm_->all_gather(send.data(), recv.data(), n, t);
      download(out, recv.data(), n * static_cast<std::size_t>(p_));
      const auto* got = static_cast<const std::uint8_t*>(out.data());
      std::size_t wrong = 0;
      for (int q = 0; q < p_; ++q)
        for (std::size_t i = 0; i < n; ++i) wrong += got[static_cast<std::size_t>(q) * n + i] != byte(q, i);
      EXPECT_EQ(wrong, 0u) << dtype_name(t) << " n=" << n;
      EXPECT_THROW(comm_->all_reduce(send.data(), send.data(), n, t, ReduceOp::max), UsageError) << dtype_name(t);
    }
}

// The collective must see data written on the compute stream just before it (a large async copy),
// and work queued on the compute stream after wait() must see its result.
TEST_F(Nccl, OrderedAfterAndBeforeTheComputeStream) {
  const std::size_t n = std::size_t{32} << 20;   // 128 MB of fp32: the copy takes long enough to race
  HostBuffer in(DType::f32, n), out(DType::f32, n);
  DeviceBuffer buf(DType::f32, n);
  for (int round = 0; round < 3; ++round) {
    for (std::size_t i = 0; i < n; ++i) in.set(i, test_value(r_, i, round));
    upload(buf.data(), in, n * 4);
    comm_->all_reduce(buf.data(), buf.data(), n, DType::f32, ReduceOp::sum);
    download(out, buf.data(), n * 4);
    Mismatches m;
    for (std::size_t i = 0; i < n; i += 7) m.expect(out.at(i), expected_reduce(DType::f32, ReduceOp::sum, p_, i, round), i);
    EXPECT_EQ(m.wrong, 0u) << "round " << round << ": " << m.first;
  }
}

// wait() orders the compute stream and returns without blocking the host: with the compute stream
// held for 300 ms by a host callback, a synchronous all-reduce call returns at once, is not
// completed, and synchronize() then blocks until it is.
TEST_F(Nccl, WaitDoesNotBlockTheHost) {
  const std::size_t n = 1 << 20;
  DeviceBuffer buf(DType::f32, n);
  CUDA_OK(cudaMemsetAsync(buf.data(), 0, n * 4, stream_));
  // NCCL connects peers lazily on a communicator's first collective, which blocks the host for up
  // to a second; that is setup, not wait(): do it before the measured call.
  comm_->all_reduce(buf.data(), buf.data(), n, DType::f32, ReduceOp::sum).synchronize();
  comm_->barrier();
  CUDA_OK(cudaLaunchHostFunc(
      stream_, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }, nullptr));
  const auto t0 = std::chrono::steady_clock::now();
  Work w = comm_->all_reduce(buf.data(), buf.data(), n, DType::f32, ReduceOp::sum);   // async=false: wait()
  const double call_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(call_s, 0.15) << "the call blocked the host";
  EXPECT_FALSE(w.is_completed());
  w.synchronize();
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(w.is_completed());
  EXPECT_GT(total_s, 0.25);
  CUDA_OK(cudaStreamSynchronize(stream_));
}

// Non-blocking communicators (issue 15): health() of the world covers the children split from
// it; idle after the streams drain, busy while a collective waits for a peer that has not joined
// yet, and no asynchronous error on the healthy path.
TEST_F(Nccl, HealthCoversSplitsAndSeesWaitingCollective) {
  auto half = comm_->split(r_ % 2, r_);
  ASSERT_NE(half, nullptr);
  half->set_compute_stream(stream_);
  DeviceBuffer d(DType::f32, 1 << 20);
  half->all_reduce(d.data(), d.data(), 1 << 20, DType::f32, ReduceOp::sum);
  comm_->barrier();
  CUDA_OK(cudaStreamSynchronize(stream_));
  CommHealth h = comm_->health();
  EXPECT_EQ(h.error, "");
  EXPECT_FALSE(h.busy);
  if (p_ < 2) return;
  // Rank 0 starts an all-reduce 0.5 s before the others: meanwhile its stream is busy. (Without
  // check mode, which would hold rank 0 on the host until the others join.)
  auto plain = make_nccl_communicator(test::mpi_env().world(), device_, NcclOptions{false});
  plain->set_compute_stream(stream_);
  // NCCL connects lazily: a fresh communicator's first collective sets up its connections on the
  // host (ncclInProgress, polled until the peers join), so the staggered call below would wait
  // on the host instead of on the stream. Connect first (seen on 2 H100s: busy was false).
  plain->all_reduce(d.data(), d.data(), 1 << 20, DType::f32, ReduceOp::sum).synchronize();
  comm_->barrier();
  if (r_ != 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Work w = plain->all_reduce(d.data(), d.data(), 1 << 20, DType::f32, ReduceOp::sum, async_call());
  if (r_ == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(plain->health().busy);
  }
  w.synchronize();
  EXPECT_FALSE(plain->health().busy);
  EXPECT_EQ(plain->health().error, "");
}

TEST_F(Nccl, SplitAndSendrecv) {
  auto half = comm_->split(r_ % 2, r_);
  ASSERT_NE(half, nullptr);
  half->set_compute_stream(stream_);
  EXPECT_EQ(half->size(), (p_ - r_ % 2 + 1) / 2);
  EXPECT_EQ(half->rank(), r_ / 2);
  HostBuffer one(DType::i64, 1), got(DType::i64, 1);
  one.set(0, r_);
  DeviceBuffer d(DType::i64, 1);
  upload(d.data(), one, 8);
  half->all_reduce(d.data(), d.data(), 1, DType::i64, ReduceOp::sum);
  download(got, d.data(), 8);
  double want = 0;
  for (int q = r_ % 2; q < p_; q += 2) want += q;
  EXPECT_EQ(got.at(0), want);
  EXPECT_EQ(comm_->split(-1, 0), nullptr);

  const std::size_t n = 4099;
  HostBuffer out(DType::bf16, n), in(DType::bf16, n);
  for (std::size_t i = 0; i < n; ++i) out.set(i, test_value(r_, i));
  DeviceBuffer sb(DType::bf16, n), rb(DType::bf16, n);
  upload(sb.data(), out, n * 2);
  const int to = (r_ + 1) % p_, from = (r_ + p_ - 1) % p_;
  comm_->sendrecv(sb.data(), n, to, rb.data(), n, from, DType::bf16);
  download(in, rb.data(), n * 2);
  Mismatches m;
  for (std::size_t i = 0; i < n; ++i) m.expect(in.at(i), round_to(DType::bf16, test_value(from, i)), i);
  EXPECT_EQ(m.wrong, 0u) << m.first;
}

TEST_F(Nccl, CheckModeCatchesMismatchesAndRingIsRefused) {
  EXPECT_THROW(comm_->set_algo(Algo::ring), UsageError);
  EXPECT_THROW(comm_->set_algo(Algo::shm), UsageError);
  if (p_ < 2) GTEST_SKIP() << "mismatch needs 2 ranks";
  DeviceBuffer d(DType::f32, 64);
  EXPECT_THROW(comm_->all_reduce(d.data(), d.data(), r_ == 0 ? 8 : 9, DType::f32, ReduceOp::sum), Error);
  EXPECT_THROW(comm_->broadcast(d.data(), 8, DType::f32, r_ == 0 ? 0 : 1), Error);
  comm_->all_reduce(d.data(), d.data(), 8, DType::f32, ReduceOp::sum);   // still usable
  CUDA_OK(cudaStreamSynchronize(stream_));
}

}  // namespace
}  // namespace lmscale::comm
