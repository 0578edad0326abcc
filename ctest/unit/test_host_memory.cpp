// core/host_memory.h against the host's own /proc/meminfo.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "lmscale/core/host_memory.h"

namespace {

TEST(HostMemory, ReadsWholeMeminfoFieldsOnly) {
  if (!std::ifstream("/proc/meminfo")) GTEST_SKIP() << "no /proc/meminfo";
  const auto total = lmscale::meminfo_bytes("MemTotal");
  const auto available = lmscale::meminfo_bytes("MemAvailable");
  ASSERT_TRUE(total.has_value());
  ASSERT_TRUE(available.has_value());
  EXPECT_GT(*total, 64.0 * 1024 * 1024);   // kB in the file, bytes here
  EXPECT_LE(*available, *total);
  // A prefix of a field name is not that field.
  EXPECT_FALSE(lmscale::meminfo_bytes("MemTot").has_value());
  EXPECT_FALSE(lmscale::meminfo_bytes("NoSuchField").has_value());
}

TEST(HostMemory, CgroupLimitIsPositiveWhenSet) {
  if (const auto c = lmscale::cgroup_memory()) {
    EXPECT_GT(c->limit, 0.0);
    EXPECT_GE(c->used, 0.0);
  }
}

}  // namespace
