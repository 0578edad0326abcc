#include "lmscale/jobs/metrics_stream.h"
#include "lmscale/core/json_string.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"
#include "lmscale/version.h"

namespace lmscale::jobs {

namespace {
std::string errno_words(int e) { return fmt::format("{} (errno {})", std::strerror(e), e); }
}  // namespace



std::string MetricsStream::json_number(double v) {
  // fmt's shortest round-trip form ("0.0003", "1e-05", "12"): valid JSON for finite values.
  return std::isfinite(v) ? fmt::format("{}", v) : std::string("null");
}

MetricsStream::MetricsStream(const std::string& path, const Config& cfg, int world, bool active) : path_(path) {
  if (path.empty() || !active) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::path(path).parent_path();
  if (!dir.empty()) fs::create_directories(dir, ec);
  // An earlier stream is replaced by a new file (deck validation allowed only that, or an empty
  // file); created exclusively and never through a link.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    throw Error(fmt::format("run.metrics: cannot replace '{}': {}", path, errno_words(errno)));
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_APPEND, 0644);
  if (fd_ < 0) throw Error(fmt::format("run.metrics: cannot create '{}': {}", path, errno_words(errno)));
  std::string deck;
  for (const auto& [key, value] : io::deck_values(cfg))
    deck += fmt::format("{}{}: {}", deck.empty() ? "" : ", ", json_string(key), json_string(value));
  write_line(fmt::format("{{\"kind\": \"deck\", \"job\": {}, \"world\": {}, \"lmscale\": {}, \"deck\": {{{}}}}}\n",
                         json_string(name_of(cfg.run.job)), world, json_string(kVersion), deck));
}

MetricsStream::~MetricsStream() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsStream::write(std::string_view kind, const std::vector<MetricsField>& fields) {
  if (fd_ < 0) return;
  std::string line = "{\"kind\": " + json_string(kind);
  for (const auto& f : fields) {
    line += ", " + json_string(f.name) + ": ";
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, double>)
            line += json_number(v);
          else if constexpr (std::is_same_v<V, std::int64_t>)
            line += fmt::format("{}", v);
          else if constexpr (std::is_same_v<V, bool>)
            line += v ? "true" : "false";
          else
            line += json_string(v);
        },
        f.value);
  }
  write_line(line + "}\n");
}

void MetricsStream::write_line(const std::string& line) {
  const char* p = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error(fmt::format("run.metrics: writing '{}' failed: {}; the lines before are kept", path_,
                              errno_words(n < 0 ? errno : EIO)));
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

}  // namespace lmscale::jobs
