// The CUDA caching allocator (core/cuda/device_allocator.h): reuse without cudaMalloc, peak and
// per-phase accounting, the timeline, stream-ordered reuse across streams, out-of-memory as a typed
// error that leaves the allocator usable; and the device peak-FLOP/s table.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "lmscale/core/cuda/device_allocator.h"
#include "lmscale/core/error.h"
#include "lmscale/core/tensor.h"
#include "lmscale/ops/device_peak.h"
#include "lmscale/ops/runtime.h"

namespace lmscale {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

class AllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override { cudaStreamDestroy(stream_); }
  cudaStream_t stream_ = nullptr;
};

TEST_F(AllocatorTest, ReusesFreedBlocksWithoutMalloc) {
  CudaCachingAllocator a(0, stream_);
  void* p = a.allocate(10 * MiB, "x");
  ASSERT_NE(p, nullptr);
  a.deallocate(p, 10 * MiB, "x");
  const auto before = a.stats();
  void* q = a.allocate(9 * MiB + 7, "y");   // rounds to the same 10 MiB block
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().device_mallocs, before.device_mallocs);
  EXPECT_EQ(a.stats().cache_hits, before.cache_hits + 1);
  // A much smaller request does not tie up the big block.
  void* r = a.allocate(1 * MiB, "z");
  EXPECT_NE(r, p);
  a.deallocate(q, 9 * MiB + 7, "y");
  a.deallocate(r, 1 * MiB, "z");
  EXPECT_EQ(a.tracker().current(), 0u);
  EXPECT_EQ(a.stats().cached, a.stats().reserved);
  a.release_cached();
  EXPECT_EQ(a.stats().reserved, 0u);
}

TEST_F(AllocatorTest, PeakPhasesAndTimeline) {
  CudaCachingAllocator a(0, stream_);
  a.tracker().record_timeline(true);
  void* w = a.allocate(4 * MiB, "weights");
  a.tracker().mark_phase("init");
  void* act1 = a.allocate(3 * MiB, "activations");
  void* act2 = a.allocate(5 * MiB, "activations");
  EXPECT_EQ(a.tracker().current(), 12 * MiB);
  EXPECT_EQ(a.tracker().by_tag().at("activations"), 8 * MiB);
  a.tracker().mark_phase("forward");
  a.deallocate(act2, 5 * MiB, "activations");
  a.deallocate(act1, 3 * MiB, "activations");
  void* gr = a.allocate(4 * MiB, "grads");
  a.tracker().mark_phase("backward");
  EXPECT_EQ(a.tracker().peak(), 12 * MiB);
  EXPECT_EQ(a.tracker().phase_peaks().at("init"), 4 * MiB);
  EXPECT_EQ(a.tracker().phase_peaks().at("forward"), 12 * MiB);
  EXPECT_EQ(a.tracker().phase_peaks().at("backward"), 12 * MiB);   // the phase starts at the forward's level
  const auto& tl = a.tracker().timeline();
  ASSERT_EQ(tl.size(), 6u);
  EXPECT_EQ(tl[2].delta, static_cast<std::int64_t>(5 * MiB));
  EXPECT_EQ(tl[2].in_use, 12 * MiB);
  EXPECT_EQ(tl[2].tag, "activations");
  EXPECT_EQ(tl[4].delta, -static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(tl[5].tag, "grads");
  for (std::size_t i = 1; i < tl.size(); ++i) EXPECT_GE(tl[i].time_s, tl[i - 1].time_s);
  a.deallocate(gr, 4 * MiB, "grads");
  a.deallocate(w, 4 * MiB, "weights");
}

// A host callback on `s` that blocks the stream until `release` is set.
struct Gate {
  std::atomic<bool> release{false};
  static void CUDART_CB wait(void* self) {
    auto* g = static_cast<Gate*>(self);
    while (!g->release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

TEST_F(AllocatorTest, CrossStreamUseDelaysReuse) {
  CudaCachingAllocator a(0, stream_);
  cudaStream_t side;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  Gate gate;
  ASSERT_EQ(cudaLaunchHostFunc(side, Gate::wait, &gate), cudaSuccess);   // `side` is busy until released

  void* p = a.allocate(2 * MiB, "buffer");
  a.record_stream(p, side);            // e.g. a collective reads it on the communication stream
  a.deallocate(p, 2 * MiB, "buffer");  // the side stream's work is still queued
  EXPECT_EQ(a.stats().pending, 2 * MiB);
  void* q = a.allocate(2 * MiB, "other");
  EXPECT_NE(q, p) << "a block in use on another stream must not be handed out";
  gate.release = true;
  ASSERT_EQ(cudaStreamSynchronize(side), cudaSuccess);
  void* r = a.allocate(2 * MiB, "again");
  EXPECT_EQ(r, p) << "once the side stream passed the free point, the block is reused";
  EXPECT_EQ(a.stats().pending, 0u);
  a.deallocate(q, 2 * MiB, "other");
  a.deallocate(r, 2 * MiB, "again");

  // Same stream: reuse at once (stream order makes it safe). A size no other cached block has.
  void* s1 = a.allocate(6 * MiB, "s");
  a.deallocate(s1, 6 * MiB, "s");
  EXPECT_EQ(a.allocate(6 * MiB, "s"), s1);
  a.deallocate(s1, 6 * MiB, "s");
  cudaStreamDestroy(side);
}

TEST_F(AllocatorTest, MoreThanTheCardThrowsOutOfMemory) {
  CudaCachingAllocator a(0, stream_);
  std::size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  void* keep = a.allocate(8 * MiB, "kept");
  try {
    a.allocate(total_b + 1024 * MiB, "too_big");
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested, total_b + 1024 * MiB);
    EXPECT_EQ(e.in_use, 8 * MiB);
    EXPECT_NE(std::string(e.what()).find("too_big"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "no sticky CUDA error after the failed cudaMalloc";
  EXPECT_EQ(a.stats().out_of_memory, 1u);
  EXPECT_EQ(a.tracker().current(), 8 * MiB);
  // Still usable.
  void* p = a.allocate(16 * MiB, "after");
  EXPECT_NE(p, nullptr);
  a.deallocate(p, 16 * MiB, "after");
  a.deallocate(keep, 8 * MiB, "kept");
}

TEST_F(AllocatorTest, ReserveLimitFlushesCacheBeforeGivingUp) {
  CudaCachingAllocator a(0, stream_);
  a.set_reserve_limit(64 * MiB);
  void* p = a.allocate(40 * MiB, "a");
  EXPECT_THROW(a.allocate(30 * MiB, "b"), OutOfMemory);   // 40 + 30 > 64
  a.deallocate(p, 40 * MiB, "a");                          // cached, still reserved
  void* q = a.allocate(30 * MiB, "b");                     // 40 MiB block is > 1.25x: flush, then fits
  EXPECT_NE(q, nullptr);
  EXPECT_EQ(a.stats().cache_flushes, 2u);   // one in the failed try, one here
  EXPECT_LE(a.stats().reserved, 64 * MiB);
  a.deallocate(q, 30 * MiB, "b");
}

TEST_F(AllocatorTest, RuntimeTensorsUseTheCachingAllocator) {
  ops::Runtime rt(Device::cuda, 0, false);
  auto& alloc = dynamic_cast<CudaCachingAllocator&>(rt.allocator());
  const std::size_t base = alloc.tracker().current();   // the cuBLASLt workspace
  {
    Tensor t = Tensor::empty({1024, 1024}, DType::f32, rt.allocator(), "t");
    EXPECT_EQ(alloc.tracker().current(), base + 4 * MiB);
  }
  EXPECT_EQ(alloc.tracker().current(), base);
  const auto mallocs = alloc.stats().device_mallocs;
  Tensor t2 = Tensor::empty({1024, 1024}, DType::f32, rt.allocator(), "t2");
  EXPECT_EQ(alloc.stats().device_mallocs, mallocs);
  EXPECT_EQ(alloc.stream(), static_cast<cudaStream_t>(rt.ctx().stream));
}

TEST(DevicePeak, TableAndFallback) {
  const auto h100 = ops::device_peak("NVIDIA H100 80GB HBM3");
  EXPECT_TRUE(h100.from_table);
  EXPECT_DOUBLE_EQ(h100.bf16, 989e12);
  EXPECT_DOUBLE_EQ(h100.fp32, 67e12);
  EXPECT_DOUBLE_EQ(h100.tf32, 494e12);
  EXPECT_DOUBLE_EQ(h100.flops_for(DType::f32, true), 494e12);
  EXPECT_DOUBLE_EQ(h100.flops_for(DType::f32, false), 67e12);
  EXPECT_DOUBLE_EQ(ops::device_peak("NVIDIA H200").bf16, 989e12);
  EXPECT_EQ(ops::device_peak("NVIDIA H100 PCIe").name, "H100 PCIe");
  const auto unknown = ops::device_peak("Some Future GPU", 100, 2.0);
  EXPECT_FALSE(unknown.from_table);
  EXPECT_DOUBLE_EQ(unknown.bf16, 4096.0 * 100 * 2e9);
  EXPECT_EQ(ops::device_peak("cpu").bf16, 0.0);
  // The device this test runs on.
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  const auto here = ops::device_peak(prop.name, prop.multiProcessorCount, 1.8);
  std::printf("device '%s': peak bf16 %.0f TFLOP/s (%s)\n", prop.name, here.bf16 / 1e12, here.name.c_str());
  EXPECT_GT(here.bf16, 0.0);
}

}  // namespace
}  // namespace lmscale
