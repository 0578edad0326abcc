#pragma once
// Internal: the overwrite rule for every file lmscale writes (run.output, train.save,
// train.checkpoint_path; docs/hdf5.md "Overwrite rule"). A file is written as NAME.tmp and renamed
// to NAME; that is allowed only when
//   - NAME is a new name, or a regular file that is empty or an HDF5 file (a previous result), or a
//     symbolic link to one of those or to nothing (the rename replaces the link, never its target);
//   - NAME.tmp is absent, or a regular file that is empty or an HDF5 file (left by a stopped run);
//   - the directory of NAME exists and is writable, or can be created (its nearest existing
//     ancestor is a writable directory).
// Devices, FIFOs, sockets, directories and files of other formats are never replaced. A name ending
// in .safetensors (a weights file, weights_format.h) replaces a safetensors file instead of an
// HDF5 one.
#include <optional>
#include <string>

namespace lmscale::io::detail {

// Why `path` cannot be written under the rule above ("exists and is a FIFO", ...), or nullopt.
// Touches nothing: used by deck validation (UsageError naming the key).
// `format`: what the file holds, and so what earlier file it may replace: an HDF5 file (results,
// weights, checkpoints), a Chrome-trace JSON (run.trace: an earlier trace, is_empty_or_trace) or
// a metrics stream (run.metrics: an earlier stream, is_empty_or_metrics).
enum class OutputFormat { hdf5, trace, metrics };
std::optional<std::string> output_problem(const std::string& path, OutputFormat format = OutputFormat::hdf5);

// Why files cannot be created in the directory `dir` (train.checkpoint_dir): it, or its nearest
// existing ancestor when it is missing, must be a writable directory; nullopt when they can.
std::optional<std::string> directory_problem(const std::string& dir);

// The target alone (not NAME.tmp, not the directory): checked again just before the rename.
std::optional<std::string> replace_problem(const std::string& path, OutputFormat format = OutputFormat::hdf5);

// Which file a path names (issue 36: outputs are identified by file identity, not by their text).
// An existing file: its device and inode (hard links, symbolic links, `./x` and absolute spellings
// all give the same); a name not yet created: the canonical path of its directory (links
// resolved) plus its name.
struct FileIdentity {
  bool exists = false;
  unsigned long long device = 0, inode = 0;
  std::string canonical;   // absolute, links resolved as far as the path exists
};
FileIdentity file_identity(const std::string& path);
bool same_file(const FileIdentity& a, const FileIdentity& b);
// True when `file` lies below the directory `dir` (at any depth), by canonical paths.
bool lies_below(const FileIdentity& file, const FileIdentity& dir);

// A system error in words, with its number and symbolic name where known: "No space left on
// device (errno 28, ENOSPC)".
std::string errno_text(int e);

// True for a regular file that is empty or starts with '{"traceEvents"' (what run.trace writes), plain or
// gzip-compressed.
bool is_empty_or_trace(const std::string& path);

// True for a regular file that is empty or starts like a safetensors file: an 8-byte
// little-endian header length that fits the file, then '{'. Names ending in .safetensors
// (weights_format.h) may replace only such files, instead of HDF5 ones.
bool is_empty_or_safetensors(const std::string& path);
// True for a regular file that is empty or starts with '{"kind": "deck"' (what run.metrics writes).
bool is_empty_or_metrics(const std::string& path);

// True for a regular file that is empty or starts with the HDF5 signature (at offset 0 or at a
// user-block offset 512, 1024, 2048, ...).
bool is_empty_or_hdf5(const std::string& path);

}  // namespace lmscale::io::detail
