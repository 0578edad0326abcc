#pragma once
// Writes a rank's Chrome-trace JSON file (run.trace, docs/profiling.md) under the overwrite rule of
// output_target.h: the text goes to NAME.tmp, the target is checked again, then NAME.tmp is renamed
// to NAME, so a stopped run never leaves half a trace under the real name. A name ending in ".gz"
// is written gzip-compressed (zlib), as HTA and Perfetto read it.
#include <string>

namespace lmscale::io {

// The file rank `rank` writes for run.trace = `path`: NAME.json -> NAME.rank{r}.json, NAME.json.gz
// -> NAME.rank{r}.json.gz, any other name -> NAME.rank{r}.json.
std::string trace_rank_path(const std::string& path, int rank);

// Throws lmscale::Error naming run.trace when the file cannot be written or may not be replaced.
void write_trace_file(const std::string& path, const std::string& json);

}  // namespace lmscale::io
