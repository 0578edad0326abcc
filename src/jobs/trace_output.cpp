#include "lmscale/jobs/trace_output.h"

#include <fmt/format.h>

#include <vector>

#include "lmscale/core/error.h"
#include "lmscale/io/trace_file.h"

namespace lmscale::jobs {

namespace {

// Metadata events ("ph":"M"): Perfetto and chrome://tracing label rows with these names and sort
// processes by rank.
std::string metadata(int rank) {
  std::string out = fmt::format(
      R"({{"name":"process_name","ph":"M","pid":{0},"tid":0,"ts":0,"args":{{"name":"rank {0}"}}}},)"
      "\n"
      R"({{"name":"process_sort_index","ph":"M","pid":{0},"tid":0,"ts":0,"args":{{"sort_index":{0}}}}})",
      rank);
  for (int t : {trace::kHost, trace::kComm, trace::kCommP2P, trace::kCudaCompute, trace::kMemory}) {
    out += fmt::format(",\n" R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"ts":0,"args":{{"name":{}}}}})",
                       rank, t, trace::json_string(trace::track_name(t)));
    out += fmt::format(",\n" R"({{"name":"thread_sort_index","ph":"M","pid":{},"tid":{},"ts":0,"args":{{"sort_index":{}}}}})",
                       rank, t, t);
  }
  return out;
}

}  // namespace

void write_merged_trace(MPI_Comm world, const trace::Recorder& rec, const std::string& path) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  const std::string mine = rec.serialize(rank);
  // Sizes as int: MPI counts; a trace past 2 GiB per rank is refused rather than truncated.
  if (mine.size() > static_cast<std::size_t>(INT32_MAX))
    throw Error(fmt::format("run.trace: rank {} recorded {} bytes of events, more than one gather can carry",
                            rank, mine.size()));
  int n = static_cast<int>(mine.size());
  std::vector<int> counts(rank == 0 ? static_cast<std::size_t>(size) : 0);
  MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, world);
  std::vector<int> displs(counts.size());
  std::size_t total = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    if (total > static_cast<std::size_t>(INT32_MAX))
      throw Error("run.trace: the merged trace is larger than 2 GiB; record fewer steps");
    displs[r] = static_cast<int>(total);
    total += static_cast<std::size_t>(counts[r]);
  }
  std::string all(total, '\0');
  MPI_Gatherv(mine.data(), n, MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR, 0, world);
  if (rank != 0) return;

  std::string json = "{\"traceEvents\":[\n";
  for (int r = 0; r < size; ++r) {
    if (r > 0) json += ",\n";
    json += metadata(r);
    if (counts[static_cast<std::size_t>(r)] > 0) {
      json += ",\n";
      json.append(all, static_cast<std::size_t>(displs[static_cast<std::size_t>(r)]),
                  static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]));
    }
  }
  // Timestamps are microseconds since the barrier at the start of the job, on each rank's clock.
  json += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"clock\":\"per-rank steady clock, 0 = barrier at job start\"}}\n";
  io::write_trace_file(path, json);
}

}  // namespace lmscale::jobs
