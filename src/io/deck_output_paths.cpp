// The deck's output paths (docs/reliability.md "How outputs are identified and guarded"): every
// file the job reads or writes compared by identity, with the names outputs use beside their own,
// and every file it writes under the overwrite rule (output_target.h, docs/hdf5.md).
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "deck_validate.h"
#include "lmscale/core/error.h"
#include "lmscale/io/output_lock.h"
#include "lmscale/io/trace_file.h"
#include "output_target.h"

namespace lmscale::io::detail {

namespace {

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw UsageError(fmt::format(format, std::forward<Args>(args)...));
}

// Jobs that read training data: train, and prune's fine-tuning and evaluation.
bool trains(const Config& c) { return c.run.job == JobKind::train || c.run.job == JobKind::prune; }

// Every file the job reads or writes, compared by identity (device and inode, or the canonical
// directory plus the name for files not yet created; issue 36): two keys naming the same file in
// any spelling (./x.h5, an absolute path, a link, a hard link) are an error before any work.
// Allowed: train.resume = train.checkpoint_path (a single-file checkpoint continues its own
// lineage) and a train.resume below train.checkpoint_dir.
void check_aliases(const Config& c, int world_size) {
  struct Entry {
    std::string key, path;
    bool output;
  };
  std::vector<Entry> files{{"run.output", c.run.output, true}};
  // run.trace itself, and the file each rank writes (NAME.rank{r}.json, io/trace_file.h).
  if (!c.run.trace.empty()) files.push_back({"run.trace", c.run.trace, true});
  for (int r = 0; !c.run.trace.empty() && r < world_size; ++r)
    files.push_back({fmt::format("run.trace (rank {}'s file)", r), trace_rank_path(c.run.trace, r), true});
  if (!c.run.metrics.empty()) files.push_back({"run.metrics", c.run.metrics, true});
  std::string checkpoint_dir;
  if (c.run.job == JobKind::train) {
    if (!c.train.save.empty()) files.push_back({"train.save", c.train.save, true});
    if (c.train.checkpoint_every > 0 && c.train.checkpoint_dir.empty() && !c.train.checkpoint_path.empty())
      files.push_back({"train.checkpoint_path", c.train.checkpoint_path, true});
    if (!c.train.resume.empty() && c.train.resume != "auto") files.push_back({"train.resume", c.train.resume, false});
    checkpoint_dir = c.train.checkpoint_dir;
  }
  if (c.run.job == JobKind::prune) {
    if (!c.prune.output.empty()) files.push_back({"prune.output", c.prune.output, true});
    if (!c.prune.weights.empty()) files.push_back({"prune.weights", c.prune.weights, false});
  }
  if (trains(c) && (c.data.source == DataSource::tokens || c.data.source == DataSource::text)) {
    if (!c.data.path.empty()) files.push_back({"data.path", c.data.path, false});
    if (!c.data.val_path.empty()) files.push_back({"data.val_path", c.data.val_path, false});
  }
  std::vector<FileIdentity> ids;
  for (const auto& f : files) ids.push_back(file_identity(f.path));
  const auto allowed = [](const std::string& a, const std::string& b) {
    return (a == "train.resume" && b == "train.checkpoint_path") || (a == "train.checkpoint_path" && b == "train.resume");
  };
  for (std::size_t i = 0; i < files.size(); ++i)
    for (std::size_t j = i + 1; j < files.size(); ++j) {
      if (!files[i].output && !files[j].output) continue;   // two inputs may be one file
      // run.trace and its rank files never coincide (distinct names in one directory).
      if (files[i].key.starts_with("run.trace") && files[j].key.starts_with("run.trace")) continue;
      if (allowed(files[i].key, files[j].key) || !same_file(ids[i], ids[j])) continue;
      fail("{} = '{}' and {} = '{}' are the same file ('{}'); give each its own path (lmscale compares files by "
           "identity: relative and absolute paths, links and hard links to one file are the same file)",
           files[i].key, files[i].path, files[j].key, files[j].path, ids[j].canonical);
    }
  // The names an output uses beside its own while it is written (NAME.tmp, then renamed; NAME.lock,
  // its writer's lock; DIR/lmscale.lock of the checkpoint directory): another file of the run
  // there would be removed, overwritten or taken for a lock.
  struct Companion {
    std::size_t owner;   // index in files, or files.size() for train.checkpoint_dir
    std::string path;
  };
  std::vector<Companion> companions;
  for (std::size_t i = 0; i < files.size(); ++i)
    if (files[i].output)
      for (const char* suffix : {".tmp", ".lock"}) companions.push_back({i, files[i].path + suffix});
  if (!checkpoint_dir.empty()) companions.push_back({files.size(), directory_lock_path(checkpoint_dir)});
  for (const auto& companion : companions) {
    const auto id = file_identity(companion.path);
    const std::string owner = companion.owner < files.size()
                                  ? fmt::format("{} = '{}'", files[companion.owner].key, files[companion.owner].path)
                                  : fmt::format("train.checkpoint_dir = '{}'", checkpoint_dir);
    for (std::size_t j = 0; j < files.size(); ++j)
      if (j != companion.owner && same_file(ids[j], id))
        fail("{} = '{}' is '{}', the name {} uses while it is written (its temporary file or lock); give each its own "
             "path",
             files[j].key, files[j].path, companion.path, owner);
  }
  if (checkpoint_dir.empty()) return;
  // The checkpoint directory's step_* folders are written and rotated by lmscale: no other file
  // of the run may lie in them (train.save = ck/step_N/index.h5 would replace an index).
  const auto dir = file_identity(checkpoint_dir);
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (!files[i].output) continue;
    if (same_file(ids[i], dir))
      fail("{} = '{}' and train.checkpoint_dir = '{}' are the same path; give each its own path", files[i].key,
           files[i].path, checkpoint_dir);
    if (!lies_below(ids[i], dir)) continue;
    const std::string below = ids[i].canonical.substr(dir.canonical.size() + (dir.canonical == "/" ? 0 : 1));
    if (below.rfind("step_", 0) == 0)
      fail("{} = '{}' lies in '{}', a step folder of train.checkpoint_dir = '{}' that lmscale writes and rotates; "
           "give it a path outside the checkpoint folders",
           files[i].key, files[i].path, below.substr(0, below.find('/')), checkpoint_dir);
  }
}

// Every file the run will write, under the overwrite rule (output_target.h, docs/hdf5.md).
}  // namespace

void check_output_paths(const Config& c, int world_size) {
  check_aliases(c, world_size);
  std::vector<std::pair<std::string, std::string>> outputs{{"run.output", c.run.output}};
  if (c.run.job == JobKind::prune && !c.prune.output.empty()) outputs.emplace_back("prune.output", c.prune.output);
  if (c.run.job == JobKind::train) {
    if (!c.train.save.empty()) outputs.emplace_back("train.save", c.train.save);
    if (c.train.checkpoint_every > 0 && c.train.checkpoint_dir.empty())
      outputs.emplace_back("train.checkpoint_path", c.train.checkpoint_path);
    // A checkpoint directory: an existing writable directory, or a new one that can be created;
    // its files are new names. Reported with the user's path (issue 36 item 8).
    if (!c.train.checkpoint_dir.empty()) {
      std::error_code ec;
      const auto status = std::filesystem::symlink_status(c.train.checkpoint_dir, ec);
      if (std::filesystem::exists(status) && !std::filesystem::is_directory(c.train.checkpoint_dir, ec))
        fail("train.checkpoint_dir = '{}' exists and is not a directory; choose another path", c.train.checkpoint_dir);
      if (const auto problem = directory_problem(c.train.checkpoint_dir))
        fail("train.checkpoint_dir = '{}' {}; choose a directory lmscale can write checkpoints to",
             c.train.checkpoint_dir, *problem);
    }
  }
  for (const auto& [key, path] : outputs) {
    if (path == c.run.trace)
      fail("run.trace = '{}' is also {}; give the trace a path of its own", c.run.trace, key);
    if (const auto problem = output_problem(path))
      fail("{} = '{}' {}; choose another path (lmscale writes a new file or replaces an HDF5 file, never anything "
           "else: docs/hdf5.md)",
           key, path, *problem);
  }
  // The trace is JSON, one file per rank: each may replace an earlier trace, not an HDF5 file.
  if (!c.run.trace.empty() && c.run.trace.back() == '/')
    fail("run.trace = '{}' names a directory (ends with '/'); give a file name such as DIR/trace.json (each rank "
         "writes DIR/trace.rank{{r}}.json: docs/profiling.md)",
         c.run.trace);
  for (int r = 0; !c.run.trace.empty() && r < world_size; ++r) {
    const std::string file = trace_rank_path(c.run.trace, r);
    if (const auto problem = output_problem(file, OutputFormat::trace))
      fail("run.trace = '{}': rank {}'s trace '{}' {}; choose another path (lmscale writes a new file or replaces a "
           "trace it wrote, never anything else: docs/profiling.md)",
           c.run.trace, r, file, *problem);
  }
  // The metrics stream is JSON Lines, written in place (it is meant to be tailed): it may replace
  // an earlier stream, not a result.
  if (!c.run.metrics.empty()) {
    if (const auto problem = output_problem(c.run.metrics, OutputFormat::metrics))
      fail("run.metrics = '{}' {}; choose another path (lmscale writes a new file or replaces a metrics stream it "
           "wrote, never anything else: docs/metrics.md)",
           c.run.metrics, *problem);
  }
}

}  // namespace lmscale::io::detail
