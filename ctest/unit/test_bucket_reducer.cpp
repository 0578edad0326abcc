// parallel::BucketReducer: the one counter of ready gradients that DDP and ZeRO-2 share
// (docs/architecture.md §4). A recording backend shows when each bucket launches.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lmscale/core/error.h"
#include "lmscale/parallel/bucket_reducer.h"

namespace lmscale {
namespace {

using parallel::BucketReducer;

// Every call the reducer makes, in order: "begin", "launch b", "complete"; also the ready
// events the test feeds in ("ready i"), so launch points are visible between them.
struct RecordingBackend final : parallel::BucketBackend {
  std::vector<std::string>* log;
  explicit RecordingBackend(std::vector<std::string>& l) : log(&l) {}
  void begin_step() override { log->push_back("begin"); }
  void launch(int b) override { log->push_back("launch " + std::to_string(b)); }
  void complete() override { log->push_back("complete"); }
};

// Five parameters of 4, 4, 8, 2, 2 fp32 elements, back to back.
std::vector<model::ParamInfo> five_params() {
  std::vector<model::ParamInfo> p;
  std::int64_t at = 0;
  for (std::int64_t n : {4, 4, 8, 2, 2}) {
    model::ParamInfo i;
    i.offset = at;
    i.numel = n;
    i.shape = {n};
    p.push_back(i);
    at += n;
  }
  return p;
}

// Runs one backward through the hooks: on_grad_ready for each parameter in `order`, logged.
void backward(const model::ParallelContext& pc, const std::vector<int>& order, std::vector<std::string>& log) {
  for (int i : order) {
    log.push_back("ready " + std::to_string(i));
    pc.on_grad_ready(i);
  }
}

TEST(BucketReducer, LaunchesEachBucketWhenItsLastGradientIsReady) {
  // 8 fp32 elements a bucket, taken in reverse order: {3, 4}, {2}, {0, 1}.
  const auto buckets = parallel::gradient_buckets(five_params(), 32.0, 4);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].first, 3);
  EXPECT_EQ(buckets[0].last, 4);
  EXPECT_EQ(buckets[1].first, 2);
  EXPECT_EQ(buckets[2].first, 0);
  EXPECT_EQ(buckets[2].last, 1);
  std::vector<std::string> log;
  RecordingBackend rec(log);
  BucketReducer r(buckets, 5, rec);
  // The backward finishes parameters in reverse order, but a bucket waits for all of its own,
  // whatever their order: bucket 0 launches after 3, bucket 2 after 1.
  const model::ParallelContext pc = r.hooks(0, 1);
  ASSERT_TRUE(static_cast<bool>(pc.on_grad_ready));
  EXPECT_TRUE(r.armed());
  backward(pc, {4, 2, 0, 3, 1}, log);
  r.finish();
  EXPECT_FALSE(r.armed());
  const std::vector<std::string> want = {"begin",   "ready 4", "ready 2", "launch 1", "ready 0",
                                         "ready 3", "launch 0", "ready 1", "launch 2", "complete"};
  EXPECT_EQ(log, want);
}

TEST(BucketReducer, ArmsOnlyOnTheLastMicroBatchAndAgainEachStep) {
  std::vector<std::string> log;
  RecordingBackend rec(log);
  BucketReducer r(parallel::gradient_buckets(five_params(), 1e9, 4), 5, rec);   // one bucket
  for (int step = 0; step < 2; ++step) {
    log.clear();
    // Micro-batch 0 of 2 accumulates only: no hook, nothing begun.
    EXPECT_FALSE(static_cast<bool>(r.hooks(0, 2).on_grad_ready));
    EXPECT_FALSE(r.armed());
    EXPECT_TRUE(log.empty());
    const model::ParallelContext pc = r.hooks(1, 2);
    backward(pc, {4, 3, 2, 1}, log);
    EXPECT_EQ(log.back(), "ready 1") << "launched before its last gradient, step " << step;
    backward(pc, {0}, log);
    EXPECT_EQ(log.back(), "launch 0") << "step " << step;
    r.finish();
    EXPECT_EQ(log.front(), "begin");
    EXPECT_EQ(log.back(), "complete");
  }
}

TEST(BucketReducer, FinishNamesABucketThatStillWaits) {
  std::vector<std::string> log;
  RecordingBackend rec(log);
  BucketReducer r(parallel::gradient_buckets(five_params(), 32.0, 4), 5, rec);
  backward(r.hooks(0, 1), {4, 3, 2}, log);   // parameters 0 and 1 (bucket 2) never ready
  try {
    r.finish();
    FAIL() << "finish() passed with bucket 2 incomplete";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient bucket 2 still waits for 2 gradients"), std::string::npos)
        << e.what();
  }
  // The backend's waits never ran: they would block on reductions that never started.
  EXPECT_EQ(log.back(), "launch 1");
}

TEST(BucketReducer, OneBucketPerParameterLaunchesEachGradientAtOnce) {
  const auto buckets = parallel::one_bucket_per_parameter(five_params());
  ASSERT_EQ(buckets.size(), 5u);
  for (int b = 0; b < 5; ++b) {
    EXPECT_EQ(buckets[static_cast<std::size_t>(b)].first, 4 - b);
    EXPECT_EQ(buckets[static_cast<std::size_t>(b)].numel, five_params()[static_cast<std::size_t>(4 - b)].numel);
  }
  std::vector<std::string> log;
  RecordingBackend rec(log);
  BucketReducer r(buckets, 5, rec);
  backward(r.hooks(0, 1), {4, 3, 2, 1, 0}, log);
  r.finish();
  const std::vector<std::string> want = {"begin",   "ready 4", "launch 0", "ready 3", "launch 1", "ready 2",
                                         "launch 2", "ready 1", "launch 3", "ready 0", "launch 4", "complete"};
  EXPECT_EQ(log, want);
}

TEST(BucketReducer, ABackendSetLaterTakesTheLaunches) {
  std::vector<std::string> first_log, second_log;
  RecordingBackend first(first_log), second(second_log);
  BucketReducer r(parallel::gradient_buckets(five_params(), 1e9, 4), 5, first);
  r.set_backend(second);
  backward(r.hooks(0, 1), {4, 3, 2, 1, 0}, second_log);
  r.finish();
  EXPECT_TRUE(first_log.empty());
  EXPECT_EQ(second_log.front(), "begin");
  EXPECT_EQ(second_log.back(), "complete");
}

TEST(BucketReducer, WithoutBucketsNothingArms) {
  std::vector<std::string> log;
  RecordingBackend rec(log);
  BucketReducer r({}, 0, rec);
  EXPECT_FALSE(static_cast<bool>(r.hooks(0, 1).on_grad_ready));
  EXPECT_FALSE(r.armed());
  EXPECT_TRUE(log.empty());
}

TEST(BucketReducer, RefusesAParameterOutsideEveryBucket) {
  std::vector<std::string> log;
  RecordingBackend rec(log);
  EXPECT_THROW(BucketReducer(parallel::gradient_buckets(five_params(), 32.0, 4), 6, rec), Error);
}

}  // namespace
}  // namespace lmscale
