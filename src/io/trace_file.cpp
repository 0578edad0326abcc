#include "lmscale/io/trace_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "output_target.h"

namespace lmscale::io {

void write_trace_file(const std::string& path, const std::string& json) {
  namespace fs = std::filesystem;
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  const fs::path dir = fs::path(path).parent_path();
  if (!dir.empty()) fs::create_directories(dir, ec);
  if (const auto problem = detail::replace_problem(tmp, detail::OutputFormat::trace))
    throw Error(fmt::format("run.trace: '{}' {}", tmp, *problem));
  // Written with write(2), each error named with its errno; on failure NAME.tmp is removed (the
  // lock of run.trace, io/output_lock.h, makes it ours). A stale NAME.tmp or a link there is
  // removed first and the file created exclusively, so nothing is written through a link.
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT)
    throw Error(fmt::format("run.trace: cannot remove the stale '{}': {}", tmp, detail::errno_text(errno)));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("run.trace: cannot create '{}': {}", tmp, detail::errno_text(errno)));
  auto fail = [&](const char* what, int e) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(fmt::format("run.trace: {} '{}' failed: {}; no trace was kept", what, tmp, detail::errno_text(e)));
  };
  const char* p = json.data();
  std::size_t left = json.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing", n < 0 ? errno : EIO);
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(fmt::format("run.trace: closing '{}' failed: {}; no trace was kept", tmp, detail::errno_text(e)));
  }
  // Checked again just before the rename: something else may have appeared under the name.
  if (const auto problem = detail::replace_problem(path, detail::OutputFormat::trace))
    throw Error(fmt::format("run.trace = '{}' {}; the trace is kept in '{}'", path, *problem, tmp));
  fs::rename(tmp, path, ec);
  if (ec) throw Error(fmt::format("run.trace: cannot rename '{}' to '{}': {}", tmp, path, ec.message()));
}

}  // namespace lmscale::io
