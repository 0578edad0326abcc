#pragma once
// One writer per output file (issue 36). Before any work, the process that writes a file (rank 0)
// takes an exclusive flock(2) on NAME.lock beside it and holds it until the file is renamed into
// place (or abandoned); the lock file holds "lmscale-lock pid=PID host=HOST". A second run that
// writes the same file finds the lock held and stops with exit 2 (UsageError) naming that process,
// before it creates or removes anything, so it can no longer delete the first run's live NAME.tmp.
// The lock dies with its process (kill -9 included): a NAME.lock left behind is taken over by the
// next run. The lock file is opened with O_NOFOLLOW and must be a regular file that is empty or an
// lmscale lock: a symbolic link or another file at NAME.lock is refused, never followed or
// overwritten. A train.checkpoint_dir is locked the same way through DIR/lmscale.lock, so that two
// runs never write and rotate one checkpoint directory. A lock file left by a process that is gone
// (kill -9, a crash) is taken over with a note naming it. On file systems without flock (some NFS
// and Lustre mounts) the lock file's content is the lock: a holder on this host that still runs
// refuses the run, one that is gone is taken over with a note, one on another host refuses it
// (its liveness cannot be checked from here: the message says to remove the file if it is gone);
// a warning says that two runs starting at the same moment would not be told apart.
// docs/reliability.md.
#include <memory>
#include <string>
#include <vector>

#include "lmscale/io/config.h"

namespace lmscale::io {

class OutputLock {
 public:
  // `key` names the deck key in messages ("run.output"); `path` is the output file (not NAME.lock).
  OutputLock(const std::string& key, const std::string& path);
  // A directory written by one run at a time (train.checkpoint_dir): the lock is DIR/lmscale.lock.
  static std::unique_ptr<OutputLock> for_directory(const std::string& key, const std::string& dir);
  ~OutputLock();   // removes NAME.lock, then the directories it created while they are empty
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;
  const std::string& lock_path() const { return lock_path_; }

 private:
  // `shown`: the user's path for messages; `what`: what the holder does there ("writing this file").
  OutputLock(const std::string& key, const std::string& shown, const std::string& lock_path, const char* what);
  int fd_ = -1;
  std::string lock_path_;
  std::vector<std::string> created_dirs_;   // innermost first
};

std::string lock_path_for(const std::string& path);   // PATH.lock
std::string directory_lock_path(const std::string& dir);   // DIR/lmscale.lock

// Locks every file this process writes for `c`, held as long as the result lives: on rank 0
// run.output, run.metrics, train.save, train.checkpoint_path and the directory
// train.checkpoint_dir for train, prune.output for prune; on every rank its own trace file
// (run.trace's NAME.rank{r}.json, io/trace_file.h).
std::vector<std::unique_ptr<OutputLock>> lock_outputs(const Config& c, int rank);

}  // namespace lmscale::io
