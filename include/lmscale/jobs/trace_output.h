#pragma once
// run.trace: every rank's events merged into one Chrome-trace JSON file by rank 0 (docs/profiling.md).
#include <mpi.h>

#include <string>

#include "lmscale/core/trace.h"

namespace lmscale::jobs {

// Collective over `world`: rank 0 gathers every rank's events and writes `path` with pid = rank,
// tid = track (trace::Track) and metadata events naming each process ("rank N") and track.
void write_merged_trace(MPI_Comm world, const trace::Recorder& rec, const std::string& path);

}  // namespace lmscale::jobs
