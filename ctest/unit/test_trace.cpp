// core/trace.h: ranges become complete events only while a recorder is active, nested ranges nest
// in time, counters follow the allocator, and names are escaped into valid JSON strings.
#include <gtest/gtest.h>

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "lmscale/core/allocator.h"
#include "lmscale/core/json_string.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/core/trace.h"
#include "lmscale/io/trace_file.h"
#include "lmscale/jobs/trace_output.h"

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

// Memory counters are sampled (issue 38): 2000 allocator events in a burst give a sample per
// millisecond at most, not one each; a sample carries the bytes in use and the interval's largest
// value, so a peak between samples is not lost.
TEST(Trace, AllocatorCountersAreSampled) {
  trace::Recorder rec;
  HostAllocator alloc;
  double burst_ms = 0;
  {
    trace::ActiveTrace on(&rec);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000; ++i) {
      void* p = alloc.allocate(4096, "test");
      alloc.deallocate(p, 4096, "test");
    }
    burst_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    void* p = alloc.allocate(8192, "test");   // more than the interval since the last sample: sampled
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    alloc.deallocate(p, 8192, "test");        // sampled: 0 in use, 8192 the interval's largest
  }
  const std::string json = rec.serialize(0);
  std::size_t counters = 0;
  for (auto at = json.find(R"("ph":"C")"); at != std::string::npos; at = json.find(R"("ph":"C")", at + 1)) ++counters;
  EXPECT_GE(counters, 3u) << json;
  EXPECT_LE(static_cast<double>(counters), 3 + burst_ms) << "one sample per millisecond at most: " << json;
  EXPECT_NE(json.find(R"("args":{"bytes":4096,"max_bytes":4096})"), std::string::npos) << json;   // the first event
  EXPECT_NE(json.find(R"("args":{"bytes":8192,"max_bytes":8192})"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("args":{"bytes":0,"max_bytes":8192})"), std::string::npos) << json;
}

// HTA (Holistic Trace Analysis) keeps only events with a category and splits iterations by
// ProfilerStep#N spans; tracks() lists only the tracks that hold events (no empty track is declared).
TEST(Trace, ProfilerStepsCategoriesAndTracks) {
  trace::Recorder rec;
  {
    trace::ActiveTrace on(&rec);
    trace::ProfilerStep step(7);
    NvtxRange range("forward");
  }
  rec.complete("kernel range", trace::kCudaCompute, 1.0, 2.0);
  const std::string json = rec.serialize(0);
  EXPECT_NE(json.find(R"("name":"ProfilerStep#7","ph":"X","pid":0,"tid":0,)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("cat":"user_annotation")"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("cat":"cpu_op")"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("cat":"gpu_user_annotation")"), std::string::npos) << json;
  EXPECT_EQ(rec.tracks(), (std::vector<int>{trace::kHost, trace::kCudaCompute}));
  const std::size_t before = rec.size();
  { trace::ProfilerStep outside(1); }   // no active recorder: nothing recorded
  EXPECT_EQ(rec.size(), before);
  EXPECT_TRUE(trace::Recorder().tracks().empty());
}

// One file per rank (issue 38): names, the distributedInfo HTA maps files to ranks by, metadata
// for the tracks with events only, and a .gz name written gzip-compressed (read back with zlib).
TEST(Trace, RankFilesForHta) {
  EXPECT_EQ(io::trace_rank_path("out/t.json", 3), "out/t.rank3.json");
  EXPECT_EQ(io::trace_rank_path("out/t.json.gz", 0), "out/t.rank0.json.gz");
  EXPECT_EQ(io::trace_rank_path("t.trace", 1), "t.trace.rank1.json");
  trace::Recorder rec;
  rec.complete("forward", trace::kHost, 0.0, 5.0);
  const std::string json = jobs::rank_trace_json(rec, 1, 4, "nccl");
  EXPECT_NE(json.find(R"("distributedInfo":{"backend":"nccl","rank":1,"world_size":4})"), std::string::npos) << json;
  EXPECT_EQ(json.rfind(R"({"traceEvents":[)", 0), 0u) << "an earlier trace is recognised by its start";
  EXPECT_NE(json.find(R"("name":"thread_name","ph":"M","pid":1,"tid":0,)"), std::string::npos) << json;
  EXPECT_EQ(json.find(R"("tid":3)"), std::string::npos) << "no empty cuda compute track: " << json;
  EXPECT_EQ(json.find(R"("tid":4)"), std::string::npos) << "no empty memory track: " << json;

  const auto dir = std::filesystem::temp_directory_path() / ("lmscale_test_trace_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string gz = (dir / "t.rank1.json.gz").string();
  io::write_trace_file(gz, json);
  gzFile f = gzopen(gz.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::string back(json.size() + 16, '\0');
  const int n = gzread(f, back.data(), static_cast<unsigned>(back.size()));
  gzclose(f);
  back.resize(static_cast<std::size_t>(std::max(n, 0)));
  EXPECT_EQ(back, json);
  EXPECT_LT(std::filesystem::file_size(gz), json.size());
  std::filesystem::remove_all(dir);
}

TEST(Trace, JsonStringEscapes) {
  EXPECT_EQ(json_string("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\"");
}

}  // namespace
}  // namespace lmscale
