// One writer per output file: NAME.lock under flock(2), held by the writing process for the run
// (include/lmscale/io/output_lock.h, docs/reliability.md).
#include "lmscale/io/output_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/io/trace_file.h"

namespace lmscale::io {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMagic = "lmscale-lock ";

std::string read_all(int fd) {
  std::string text;
  char buffer[256];
  off_t at = 0;
  while (text.size() < 4096) {
    const ssize_t n = ::pread(fd, buffer, sizeof buffer, at);
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    at += n;
  }
  return text;
}

// "pid=123 host=node1" from the lock's text, for the message.
std::string holder(const std::string& text) {
  if (text.rfind(kMagic, 0) != 0) return "another process";
  std::string rest = text.substr(std::strlen(kMagic));
  while (!rest.empty() && (rest.back() == '\n' || rest.back() == '\r')) rest.pop_back();
  return fmt::format("another lmscale process ({})", rest);
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// The process a lock file names ("lmscale-lock pid=123 host=node1").
struct Holder {
  long pid = 0;
  std::string host;
};

std::optional<Holder> parse_holder(const std::string& text) {
  if (text.rfind(kMagic, 0) != 0) return std::nullopt;
  const auto pid_at = text.find("pid="), host_at = text.find(" host=");
  if (pid_at == std::string::npos || host_at == std::string::npos || host_at < pid_at) return std::nullopt;
  Holder h;
  try {
    h.pid = std::stol(text.substr(pid_at + 4, host_at - pid_at - 4));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  h.host = text.substr(host_at + 6);
  while (!h.host.empty() && (h.host.back() == '\n' || h.host.back() == '\r')) h.host.pop_back();
  return h;
}

// kill(pid, 0): the process exists (EPERM: it exists, owned by another user).
bool process_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

// TEST-ONLY: LMSCALE_TEST_NO_FLOCK=1 behaves as a file system without flock(2) (ENOLCK), so that
// the lock file's content as the lock is tested on any machine (ctest/regression/reliability.sh).
bool flock_unavailable_for_test() {
  const char* v = std::getenv("LMSCALE_TEST_NO_FLOCK");
  return v && std::string(v) == "1";
}

}  // namespace

std::string lock_path_for(const std::string& path) { return path + ".lock"; }
std::string directory_lock_path(const std::string& dir) { return (fs::path(dir) / "lmscale.lock").string(); }

OutputLock::OutputLock(const std::string& key, const std::string& path)
    : OutputLock(key, path, lock_path_for(path), "writing this file") {}

std::unique_ptr<OutputLock> OutputLock::for_directory(const std::string& key, const std::string& dir) {
  return std::unique_ptr<OutputLock>(new OutputLock(key, dir, directory_lock_path(dir), "writing checkpoints there"));
}

OutputLock::OutputLock(const std::string& key, const std::string& path, const std::string& lock_path, const char* what)
    : lock_path_(lock_path) {
  std::error_code ec;
  // Missing directories are created here (the results file would create them a moment later) and
  // taken away again on release while empty.
  const fs::path parent = fs::path(lock_path_).parent_path();
  for (fs::path dir = parent; !dir.empty() && dir.has_relative_path(); dir = dir.parent_path()) {
    if (fs::symlink_status(dir, ec).type() != fs::file_type::not_found) break;
    created_dirs_.push_back(dir.string());
  }
  if (!created_dirs_.empty()) {
    fs::create_directories(parent, ec);
    if (ec) {
      created_dirs_.clear();
      throw UsageError(fmt::format("{} = '{}': cannot create its directory ({}); choose another path", key, path,
                                   ec.message()));
    }
  }
  auto refuse = [&](const std::string& why) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    for (const auto& dir : created_dirs_) {
      if (!fs::is_empty(dir, ec) || ec) break;
      fs::remove(dir, ec);
    }
    created_dirs_.clear();
    throw UsageError(fmt::format("{} = '{}': {}", key, path, why));
  };
  for (int attempt = 0; attempt < 20; ++attempt) {
    fd_ = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd_ < 0) {
      const int err = errno;
      if (err == ELOOP)
        refuse(fmt::format("its lock file '{}' is a symbolic link, which lmscale never follows; remove it", lock_path_));
      refuse(fmt::format("cannot open its lock file '{}' ({}); choose a writable place", lock_path_,
                         std::strerror(err)));
    }
    struct stat mine{};
    if (::fstat(fd_, &mine) != 0 || !S_ISREG(mine.st_mode))
      refuse(fmt::format("'{}' exists and is not a regular file; lmscale keeps its lock there: remove it or choose "
                         "another path",
                         lock_path_));
    int unlockable = flock_unavailable_for_test() ? ENOLCK : 0;
    if (unlockable == 0 && ::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK)
        refuse(fmt::format("{} is {} now (it holds '{}'); wait for it to end, or choose another path",
                           holder(read_all(fd_)), what, lock_path_));
      unlockable = err;
    }
    // The lock is on the file this name still refers to (a finishing run unlinks it while holding it).
    struct stat named{};
    if (unlockable == 0 &&
        (::lstat(lock_path_.c_str(), &named) != 0 || named.st_dev != mine.st_dev || named.st_ino != mine.st_ino)) {
      ::close(fd_);
      fd_ = -1;
      continue;
    }
    const std::string text = read_all(fd_);
    if (!text.empty() && text.rfind(kMagic, 0) != 0)
      refuse(fmt::format("'{}' exists and is not an lmscale lock file; lmscale keeps its lock there: remove or rename "
                         "it, or choose another path",
                         lock_path_));
    if (const auto h = parse_holder(text); h && !(h->pid == ::getpid() && h->host == host_name())) {
      // Without flock the content is the lock: a holder still running on this host refuses the run;
      // one on another host cannot be checked from here.
      if (unlockable != 0 && h->host == host_name() && process_alive(h->pid))
        refuse(fmt::format("{} is {} now (it holds '{}'); wait for it to end, or choose another path", holder(text),
                           what, lock_path_));
      if (unlockable != 0 && h->host != host_name())
        refuse(fmt::format("{} on another host holds '{}' and may still be {} (this file system has no flock, so "
                           "lmscale cannot tell whether it is gone); wait for it to end, or remove '{}' if it no "
                           "longer runs",
                           holder(text), lock_path_, what, lock_path_));
      std::fprintf(stderr, "lmscale: note: %s = '%s': taking over the lock '%s' left by pid %ld on %s, which no longer "
                           "runs\n",
                   key.c_str(), path.c_str(), lock_path_.c_str(), h->pid, h->host.c_str());
    }
    if (unlockable != 0)   // no flock on this file system: the content guards it, with a race
      std::fprintf(stderr, "lmscale: warning: %s = '%s': cannot lock '%s' (%s); its content names this process, but "
                           "two runs starting at the same moment would not be detected\n",
                   key.c_str(), path.c_str(), lock_path_.c_str(), std::strerror(unlockable));
    const std::string line = fmt::format("{}pid={} host={}\n", kMagic, ::getpid(), host_name());
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()))
      refuse(fmt::format("cannot write its lock file '{}' ({})", lock_path_, std::strerror(errno)));
    return;
  }
  if (fd_ < 0) refuse(fmt::format("its lock file '{}' keeps being replaced; try again", lock_path_));
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  ::unlink(lock_path_.c_str());   // while still holding it: a waiting opener sees the name change
  ::close(fd_);
  std::error_code ec;
  for (const auto& dir : created_dirs_) {
    if (!fs::is_empty(dir, ec) || ec) break;
    fs::remove(dir, ec);
  }
}

std::vector<std::unique_ptr<OutputLock>> lock_outputs(const Config& c, int rank) {
  std::vector<std::unique_ptr<OutputLock>> locks;
  if (!c.run.trace.empty()) locks.push_back(std::make_unique<OutputLock>("run.trace", trace_rank_path(c.run.trace, rank)));
  if (rank != 0) return locks;
  std::vector<std::pair<std::string, std::string>> outputs{{"run.output", c.run.output}};
  if (!c.run.metrics.empty()) outputs.emplace_back("run.metrics", c.run.metrics);
  if (c.run.job == JobKind::train) {
    if (!c.train.save.empty()) outputs.emplace_back("train.save", c.train.save);
    if (c.train.checkpoint_every > 0 && c.train.checkpoint_dir.empty() && !c.train.checkpoint_path.empty())
      outputs.emplace_back("train.checkpoint_path", c.train.checkpoint_path);
  }
  if (c.run.job == JobKind::prune && !c.prune.output.empty()) outputs.emplace_back("prune.output", c.prune.output);
  for (const auto& [key, path] : outputs) locks.push_back(std::make_unique<OutputLock>(key, path));
  // Two runs writing and rotating one checkpoint directory would delete each other's lineage.
  if (c.run.job == JobKind::train && !c.train.checkpoint_dir.empty())
    locks.push_back(OutputLock::for_directory("train.checkpoint_dir", c.train.checkpoint_dir));
  return locks;
}

}  // namespace lmscale::io
