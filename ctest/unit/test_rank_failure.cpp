// jobs/resilience/rank_failure.h: the one line that ends a failed job names the rank to blame from the
// watchdogs' reports: a silent rank first, else the rank not in communication while others wait,
// else the ranks reporting a communication error; and the test-only fault injection's parsing.
#include <gtest/gtest.h>

#include <cstdlib>

#include "lmscale/core/error.h"
#include "lmscale/jobs/resilience/fault_injection.h"
#include "lmscale/jobs/resilience/rank_failure.h"

namespace lmscale::jobs {
namespace {

RankReport report(int rank, RankReport::Reason reason, bool busy, std::int64_t step = 3,
                  const char* phase = "train step") {
  RankReport r;
  r.rank = rank;
  r.reason = reason;
  r.busy = busy ? 1 : 0;
  r.step = step;
  r.set_phase(phase);
  return r;
}

TEST(RankFailure, SilentRankIsBlamed) {
  std::vector<std::optional<RankReport>> reports = {report(0, RankReport::no_progress, true), std::nullopt};
  const std::string m = describe_failure(reports, 0, 5, 3);
  EXPECT_EQ(m, "no progress for 5 s (parallel.timeout_s) in the train step of step 3; rank 1 did not answer within "
               "3 s: died, stopped, or stuck where its watchdog cannot run; aborting the job");
}

TEST(RankFailure, RankOutsideCommunicationIsBlamed) {
  std::vector<std::optional<RankReport>> reports = {report(0, RankReport::no_progress, true),
                                                    report(1, RankReport::no_progress, false),
                                                    report(2, RankReport::answered_peer, true)};
  const std::string m = describe_failure(reports, 0, 10, 3);
  EXPECT_NE(m.find("rank 1 hangs outside communication (rank 1 in the train step of step 3) while ranks 0, 2 wait "
                   "for it in communication"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.rfind("no progress for 10 s", 0), 0u) << m;
}

TEST(RankFailure, TriggerOfAnotherRankIsNamed) {
  RankReport err = report(1, RankReport::comm_error, true);
  err.set_error("nccl error on rank 1/2 (cuda device 1): remote process exited");
  std::vector<std::optional<RankReport>> reports = {report(0, RankReport::answered_peer, true), err};
  const std::string m = describe_failure(reports, 0, 10, 3);
  EXPECT_EQ(m, "rank 1: nccl error on rank 1/2 (cuda device 1): remote process exited; rank 1 reports a "
               "communication error; aborting the job");
}

TEST(RankFailure, NobodyToBlameWhenAllWait) {
  std::vector<std::optional<RankReport>> reports = {report(0, RankReport::no_progress, true),
                                                    report(1, RankReport::no_progress, true)};
  const std::string m = describe_failure(reports, 0, 10, 3);
  EXPECT_NE(m.find("no rank can be singled out: every rank waits in communication"), std::string::npos) << m;
}

TEST(RankFailure, LongErrorIsTruncatedNotOverflowed) {
  RankReport r;
  r.set_error(std::string(1000, 'x'));
  EXPECT_EQ(std::string(r.error).size(), sizeof r.error - 1);
}

TEST(FaultInjection, UnsetDoesNothingAndBadValueIsUsageError) {
  ::unsetenv("LMSCALE_FAULT_SLEEP_RANK");
  EXPECT_EQ(FaultInjection::from_environment().sleep_rank, -1);
  ::setenv("LMSCALE_FAULT_SLEEP_RANK", "1", 1);
  ::setenv("LMSCALE_FAULT_SLEEP_STEP", "4", 1);
  ::setenv("LMSCALE_FAULT_SLEEP_S", "0.01", 1);
  const FaultInjection f = FaultInjection::from_environment();
  EXPECT_EQ(f.sleep_rank, 1);
  EXPECT_EQ(f.sleep_step, 4);
  EXPECT_DOUBLE_EQ(f.sleep_s, 0.01);
  f.at_step_start(1, 4);   // sleeps 10 ms
  ::setenv("LMSCALE_FAULT_SLEEP_STEP", "two", 1);
  EXPECT_THROW(FaultInjection::from_environment(), UsageError);
  ::unsetenv("LMSCALE_FAULT_SLEEP_RANK");
  ::unsetenv("LMSCALE_FAULT_SLEEP_STEP");
  ::unsetenv("LMSCALE_FAULT_SLEEP_S");
}

}  // namespace
}  // namespace lmscale::jobs
