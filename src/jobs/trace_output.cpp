#include "lmscale/jobs/trace_output.h"

#include <fmt/format.h>

#include "lmscale/core/json_string.h"
#include "lmscale/io/trace_file.h"

namespace lmscale::jobs {

namespace {

// Metadata events ("ph":"M"): Perfetto and chrome://tracing label rows with these names and sort
// processes by rank. Only the tracks with events are named: an empty track is not declared.
std::string metadata(const trace::Recorder& rec, int rank) {
  std::string out = fmt::format(
      R"({{"name":"process_name","ph":"M","pid":{0},"tid":0,"ts":0,"args":{{"name":"rank {0}"}}}},)"
      "\n"
      R"({{"name":"process_sort_index","ph":"M","pid":{0},"tid":0,"ts":0,"args":{{"sort_index":{0}}}}})",
      rank);
  for (int t : rec.tracks()) {
    out += fmt::format(",\n" R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"ts":0,"args":{{"name":{}}}}})",
                       rank, t, json_string(trace::track_name(t)));
    out += fmt::format(",\n" R"({{"name":"thread_sort_index","ph":"M","pid":{},"tid":{},"ts":0,"args":{{"sort_index":{}}}}})",
                       rank, t, t);
  }
  return out;
}

}  // namespace

std::string rank_trace_json(const trace::Recorder& rec, int rank, int world, const std::string& backend) {
  std::string json = "{\"traceEvents\":[\n" + metadata(rec, rank);
  const std::string events = rec.serialize(rank);
  if (!events.empty()) json += ",\n" + events;
  // distributedInfo as the PyTorch profiler writes it (HTA reads rank from it); timestamps are
  // microseconds since the barrier at the start of the job, on each rank's clock.
  json += fmt::format(
      "\n],\"schemaVersion\":1,\"distributedInfo\":{{\"backend\":{},\"rank\":{},\"world_size\":{}}},"
      "\"deviceProperties\":[],\"displayTimeUnit\":\"ms\","
      "\"otherData\":{{\"clock\":\"per-rank steady clock, 0 = barrier at job start\"}}}}\n",
      json_string(backend), rank, world);
  return json;
}

void write_rank_trace(const trace::Recorder& rec, const std::string& path, int rank, int world,
                      const std::string& backend) {
  io::write_trace_file(io::trace_rank_path(path, rank), rank_trace_json(rec, rank, world, backend));
}

}  // namespace lmscale::jobs
