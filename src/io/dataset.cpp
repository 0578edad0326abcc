#include "lmscale/io/dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/core/rng.h"
#include "lmscale/io/text_data.h"
#include "sample_key.h"

namespace lmscale::io {

using detail::sample_key;

void SyntheticTokens::sample(std::uint64_t step, std::int64_t first, std::int64_t rows, std::int64_t T,
                             std::int32_t* out, bool eval) const {
  const std::uint64_t V = static_cast<std::uint64_t>(vocab_);
  for (std::int64_t r = 0; r < rows; ++r) {
    const CounterRng rng(seed_, sample_key(step, first + r, eval));
    std::int32_t* seq = out + r * (T + 1);
    std::uint64_t x = rng.below(0, V);
    seq[0] = static_cast<std::int32_t>(x);
    for (std::int64_t t = 1; t <= T; ++t) {
      const auto i = static_cast<std::uint64_t>(t);
      x = rng.uniform(i, 0) < 0.75 ? (x * 7919 + 1237) % V : rng.below(i, V, 1);
      seq[t] = static_cast<std::int32_t>(x);
    }
  }
}

double SyntheticTokens::entropy() const {
  const double V = static_cast<double>(vocab_);
  const double p_succ = 0.75 + 0.25 / V, p_other = 0.25 / V;
  return -(p_succ * std::log(p_succ) + (V - 1) * p_other * std::log(p_other));
}

std::string SyntheticTokens::describe() const {
  return fmt::format("synthetic (vocab {}, succession prob 0.75, entropy {:.3f} nats)", vocab_, entropy());
}

namespace {

// Reads bytes [offset, offset + n) of `fd` into `out`; false when the file ends first. Throws on a
// read error, naming `key` and the file.
bool read_at(int fd, std::size_t offset, unsigned char* out, std::size_t n, const std::string& key,
             const std::string& path) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("{}: reading token file '{}' at byte {} failed: {} (errno {})", key, path, offset,
                              std::strerror(errno), errno));
    }
    if (got == 0) return false;
    out += got;
    offset += static_cast<std::size_t>(got);
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

std::size_t current_size(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<std::size_t>(st.st_size) : 0;
}

}  // namespace

TokenFile::File TokenFile::open_file(const std::string& key, const std::string& path) {
  File f;
  f.key = key;
  f.path = path;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw Error(fmt::format("{}: cannot open token file '{}': {}", key, path, std::strerror(errno)));
  f.bytes = current_size(f.fd);
  return f;
}

TokenFile::TokenFile(const std::string& path, const std::string& val_path, TokenDtype dtype,
                     std::int64_t vocab, std::uint64_t seed)
    : width_(token_bytes(dtype)), vocab_(vocab), seed_(seed) {
  train_ = open_file("data.path", path);
  try {
    if (!val_path.empty() && val_path != path) val_ = open_file("data.val_path", val_path);
  } catch (...) {
    ::close(train_.fd);
    throw;
  }
}

TokenFile::~TokenFile() {
  for (File* f : {&train_, &val_})
    if (f->fd >= 0) ::close(f->fd);
}

void TokenFile::sample(std::uint64_t step, std::int64_t first, std::int64_t rows, std::int64_t T, std::int32_t* out,
                       bool eval) const {
  const File& f = eval && val_.fd >= 0 ? val_ : train_;
  // The size seen at the start: the samples' offsets depend on it, whatever happens to the file.
  const std::int64_t n = static_cast<std::int64_t>(f.bytes) / width_;
  if (n < T + 2) throw Error(fmt::format("token file '{}' holds {} tokens, fewer than context_length+2", f.path, n));
  // Read with pread, not through a memory map: a file truncated under the run is an error naming
  // it, not a SIGBUS (issue 36).
  std::vector<unsigned char> bytes(static_cast<std::size_t>(T + 1) * static_cast<std::size_t>(width_));
  for (std::int64_t r = 0; r < rows; ++r) {
    const CounterRng rng(seed_, sample_key(step, first + r, eval));
    const std::int64_t start = static_cast<std::int64_t>(rng.below(0, static_cast<std::uint64_t>(n - T - 1)));
    const auto offset = static_cast<std::size_t>(start) * static_cast<std::size_t>(width_);
    if (!read_at(f.fd, offset, bytes.data(), bytes.size(), f.key, f.path))
      throw Error(fmt::format("{}: token file '{}' changed under the run: it held {} bytes at the start and holds {} "
                              "now (truncated or rewritten?); restore it (or give another file) and resume from the "
                              "last checkpoint",
                              f.key, f.path, f.bytes, current_size(f.fd)));
    for (std::int64_t t = 0; t <= T; ++t) {
      std::uint32_t v = 0;
      if (width_ == 2) {
        std::uint16_t u;
        std::memcpy(&u, bytes.data() + t * 2, 2);
        v = u;
      } else {
        std::memcpy(&v, bytes.data() + t * 4, 4);
      }
      if (static_cast<std::int64_t>(v) >= vocab_)
        throw Error(fmt::format("token file '{}': token {} at position {} is >= model.vocab_size {}", f.path, v,
                                start + t, vocab_));
      out[r * (T + 1) + t] = static_cast<std::int32_t>(v);
    }
  }
}

std::string TokenFile::describe() const {
  return fmt::format("token file {} ({} tokens of {} bytes)", train_.path, train_.bytes / static_cast<std::size_t>(width_), width_);
}

namespace {

struct IdScan {
  std::uint64_t largest = 0;
  std::size_t first_bad = 0;   // index of the first id >= limit; the count of ids when none
  std::uint64_t bad_id = 0;
};

// One pass over the `bytes` bytes of ids of type T in `fd`, read in blocks (no memory map: a file
// truncated meanwhile is an error, not a SIGBUS). The max pass vectorises; the search for the
// first bad id runs only in a block that holds one. Throws UsageError naming `key`.
template <class T>
IdScan scan_ids(int fd, std::size_t bytes, std::uint64_t limit, const std::string& key, const std::string& path) {
  constexpr std::size_t kBlockIds = (std::size_t{1} << 22) / sizeof(T);
  const std::size_t count = bytes / sizeof(T);
  std::vector<T> ids(std::min(count, kBlockIds));
  IdScan scan;
  scan.first_bad = count;
  for (std::size_t at = 0; at < count; at += ids.size()) {
    const std::size_t n = std::min(ids.size(), count - at);
    bool complete = false;
    try {
      complete = read_at(fd, at * sizeof(T), reinterpret_cast<unsigned char*>(ids.data()), n * sizeof(T), key, path);
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
    if (!complete)
      throw UsageError(fmt::format("{} = '{}' changed while it was checked: it held {} bytes and now ends before byte "
                                   "{}; is another program writing it?",
                                   key, path, bytes, (at + n) * sizeof(T)));
    T largest = 0;
    for (std::size_t i = 0; i < n; ++i) largest = std::max(largest, ids[i]);
    scan.largest = std::max<std::uint64_t>(scan.largest, largest);
    if (largest >= limit && scan.first_bad == count)
      for (std::size_t i = 0; i < n; ++i)
        if (ids[i] >= limit) {
          scan.first_bad = at + i;
          scan.bad_id = ids[i];
          break;
        }
  }
  return scan;
}

}  // namespace

void check_token_file(const std::string& key, const std::string& path, TokenDtype dtype, std::int64_t vocab,
                      std::int64_t min_tokens) {
  const std::size_t width = token_bytes(dtype);
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw UsageError(fmt::format("{} = '{}' cannot be opened: {}; fix the path", key, path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UsageError(fmt::format("{} = '{}' is not a regular file; give a token file", key, path));
  }
  const auto bytes = static_cast<std::size_t>(st.st_size);
  if (bytes % width != 0) {
    ::close(fd);
    throw UsageError(fmt::format("{} = '{}' holds {} bytes, not a whole number of data.dtype = {} tokens ({} bytes "
                                 "each); check data.dtype (uint16 or uint32) or the file",
                                 key, path, bytes, dtype, width));
  }
  const auto n = static_cast<std::int64_t>(bytes / width);
  if (n < min_tokens) {
    ::close(fd);
    throw UsageError(fmt::format("{} = '{}' holds {} tokens, but model.context_length = {} needs at least {} "
                                 "(context_length + 2); use a longer file or a smaller model.context_length",
                                 key, path, n, min_tokens - 2, min_tokens));
  }
  const auto limit = static_cast<std::uint64_t>(vocab);
  IdScan scan;
  try {
    scan = width == 2 ? scan_ids<std::uint16_t>(fd, bytes, limit, key, path)
                      : scan_ids<std::uint32_t>(fd, bytes, limit, key, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  const std::size_t first_bad = scan.first_bad;
  const std::uint64_t bad_id = scan.bad_id, largest = scan.largest;
  if (first_bad < bytes / width)
    throw UsageError(fmt::format("{} = '{}': token {} at position {} (byte {}) is >= model.vocab_size = {} (the "
                                 "largest id in the file is {}); set model.vocab_size >= {} or check data.dtype",
                                 key, path, bad_id, first_bad, first_bad * width, vocab, largest, largest + 1));
}

std::unique_ptr<TokenSource> make_token_source(const DataConfig& cfg, std::int64_t vocab, std::uint64_t seed) {
  if (cfg.source == DataSource::tokens) return std::make_unique<TokenFile>(cfg.path, cfg.val_path, cfg.dtype, vocab, seed);
  if (cfg.source == DataSource::text) return std::make_unique<TextBytes>(cfg.path, cfg.val_path, cfg.val_fraction, seed);
  return std::make_unique<SyntheticTokens>(vocab, seed);
}

}  // namespace lmscale::io
