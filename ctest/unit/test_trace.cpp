// core/trace.h: ranges become complete events only while a recorder is active, nested ranges nest
// in time, counters follow the allocator, and names are escaped into valid JSON strings.
#include <gtest/gtest.h>

#include "lmscale/core/allocator.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/core/trace.h"

namespace lmscale {
namespace {

TEST(Trace, RangesRecordedOnlyWhileActive) {
  trace::Recorder rec;
  { NvtxRange outside("not_recorded"); }
  EXPECT_EQ(rec.size(), 0u);
  {
    trace::ActiveTrace on(&rec);
    NvtxRange outer("outer");
    { NvtxRange inner("inner"); }
  }
  EXPECT_EQ(trace::active(), nullptr);   // restored when the scope ends
  ASSERT_EQ(rec.size(), 2u);
  const std::string json = rec.serialize(3);
  // inner ends first, so it is recorded first; both on the host track of pid 3.
  const auto inner = json.find(R"("name":"inner","ph":"X","pid":3,"tid":0)");
  const auto outer = json.find(R"("name":"outer","ph":"X","pid":3,"tid":0)");
  ASSERT_NE(inner, std::string::npos) << json;
  ASSERT_NE(outer, std::string::npos) << json;
  EXPECT_LT(inner, outer);
  EXPECT_NE(json.find(R"("dur":)"), std::string::npos);
}

TEST(Trace, AsyncSpanPairsAndCounter) {
  trace::Recorder rec;
  rec.async_span("all-reduce", trace::kComm, 10.0, 5.0, R"("bytes":64)");   // end before begin: clamped
  rec.counter("memory in use", 1.0, R"("bytes":128)");
  const std::string json = rec.serialize(0);
  EXPECT_NE(json.find(R"("name":"all-reduce","ph":"b","pid":0,"tid":1,"ts":10.000,"cat":"collective","id":1,"args":{"bytes":64})"),
            std::string::npos) << json;
  EXPECT_NE(json.find(R"("name":"all-reduce","ph":"e","pid":0,"tid":1,"ts":10.000,"cat":"collective","id":1})"),
            std::string::npos) << json;
  EXPECT_NE(json.find(R"("name":"memory in use","ph":"C","pid":0,"tid":4,"ts":1.000,"args":{"bytes":128})"),
            std::string::npos) << json;
}

TEST(Trace, AllocatorCountersFollowBytesInUse) {
  trace::Recorder rec;
  HostAllocator alloc;
  {
    trace::ActiveTrace on(&rec);
    void* p = alloc.allocate(4096, "test");
    alloc.deallocate(p, 4096, "test");
  }
  const std::string json = rec.serialize(0);
  EXPECT_NE(json.find(R"("bytes":4096)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("bytes":0)"), std::string::npos) << json;
}

TEST(Trace, JsonStringEscapes) {
  EXPECT_EQ(trace::json_string("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\"");
}

}  // namespace
}  // namespace lmscale
