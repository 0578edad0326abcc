#pragma once
// Writes a Chrome-trace JSON file (run.trace) under the overwrite rule of output_target.h: the text
// goes to NAME.tmp, the target is checked again, then NAME.tmp is renamed to NAME, so a stopped run
// never leaves half a trace under the real name.
#include <string>

namespace lmscale::io {

// Throws lmscale::Error naming run.trace when the file cannot be written or may not be replaced.
void write_trace_file(const std::string& path, const std::string& json);

}  // namespace lmscale::io
