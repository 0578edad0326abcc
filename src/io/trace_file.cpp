#include "lmscale/io/trace_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <fmt/format.h>
#include <zlib.h>

#include "lmscale/core/error.h"
#include "output_target.h"

namespace lmscale::io {

namespace {
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The gzip member of `text` (zlib's deflate with the gzip wrapper: windowBits 15 + 16).
std::string gzip(const std::string& text, const std::string& path) {
  if (text.size() >= (std::size_t{1} << 32))
    throw Error(fmt::format("run.trace: the trace of '{}' is {} bytes, more than zlib compresses in one call; record "
                            "fewer steps",
                            path, text.size()));
  z_stream z{};
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw Error(fmt::format("run.trace: zlib cannot start compressing '{}'", path));
  std::string out(deflateBound(&z, static_cast<uLong>(text.size())), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) throw Error(fmt::format("run.trace: zlib could not compress '{}' (deflate {})", path, rc));
  return out;
}
}  // namespace

std::string trace_rank_path(const std::string& path, int rank) {
  for (const std::string tail : {".json.gz", ".json"})
    if (ends_with(path, tail)) return fmt::format("{}.rank{}{}", path.substr(0, path.size() - tail.size()), rank, tail);
  return fmt::format("{}.rank{}.json", path, rank);
}

void write_trace_file(const std::string& path, const std::string& text) {
  // (zlib's one-shot deflate takes a 32-bit length: a rank's trace stays far below 4 GiB.)
  const std::string json = ends_with(path, ".gz") ? gzip(text, path) : text;
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
