#pragma once
// run.trace: every rank writes its own Chrome-trace JSON file (docs/profiling.md), as the PyTorch
// profiler does for HTA (Holistic Trace Analysis) and Perfetto: NAME.rank{r}.json, or
// NAME.rank{r}.json.gz when run.trace ends in .json.gz (io/trace_file.h). Each holds
// "distributedInfo" {backend, rank, world_size}, which HTA requires to map files to ranks, the
// rank's events with pid = rank and a category ("cat") each, and metadata naming the process and
// only the tracks that hold events.
#include <string>

#include "lmscale/core/trace.h"

namespace lmscale::jobs {

// The JSON document of one rank's trace.
std::string rank_trace_json(const trace::Recorder& rec, int rank, int world, const std::string& backend);
// Writes rank_trace_json to io::trace_rank_path(path, rank). Not collective.
void write_rank_trace(const trace::Recorder& rec, const std::string& path, int rank, int world,
                      const std::string& backend);

}  // namespace lmscale::jobs
