#include "lmscale/io/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

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

TokenFile::Map TokenFile::map_file(const std::string& path) {
  Map m;
  m.path = path;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(fmt::format("data.path: cannot open token file '{}': {}", path, std::strerror(errno)));
  struct stat st {};
  ::fstat(fd, &st);
  m.bytes = static_cast<std::size_t>(st.st_size);
  if (m.bytes > 0) {
    void* p = ::mmap(nullptr, m.bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw Error(fmt::format("cannot map token file '{}'", path));
    }
    m.data = static_cast<const unsigned char*>(p);
  }
  ::close(fd);
  return m;
}

TokenFile::TokenFile(const std::string& path, const std::string& val_path, TokenDtype dtype,
                     std::int64_t vocab, std::uint64_t seed)
    : width_(token_bytes(dtype)), vocab_(vocab), seed_(seed) {
  train_ = map_file(path);
  val_ = val_path.empty() || val_path == path ? Map{} : map_file(val_path);
}

TokenFile::~TokenFile() {
  for (Map* m : {&train_, &val_})
    if (m->data) ::munmap(const_cast<unsigned char*>(m->data), m->bytes);
}

void TokenFile::sample(std::uint64_t step, std::int64_t first, std::int64_t rows, std::int64_t T, std::int32_t* out,
                       bool eval) const {
  const Map& m = eval && val_.data ? val_ : train_;
  const std::int64_t n = static_cast<std::int64_t>(m.bytes) / width_;
  if (n < T + 2) throw Error(fmt::format("token file '{}' holds {} tokens, fewer than context_length+2", m.path, n));
  for (std::int64_t r = 0; r < rows; ++r) {
    const CounterRng rng(seed_, sample_key(step, first + r, eval));
    const std::int64_t start = static_cast<std::int64_t>(rng.below(0, static_cast<std::uint64_t>(n - T - 1)));
    for (std::int64_t t = 0; t <= T; ++t) {
      std::uint32_t v = 0;
      if (width_ == 2) {
        std::uint16_t u;
        std::memcpy(&u, m.data + (start + t) * 2, 2);
        v = u;
      } else {
        std::memcpy(&v, m.data + (start + t) * 4, 4);
      }
      if (static_cast<std::int64_t>(v) >= vocab_)
        throw Error(fmt::format("token file '{}': token {} at position {} is >= model.vocab_size {}", m.path, v,
                                start + t, vocab_));
      out[r * (T + 1) + t] = static_cast<std::int32_t>(v);
    }
  }
}

std::string TokenFile::describe() const {
  return fmt::format("token file {} ({} tokens of {} bytes)", train_.path, train_.bytes / width_, width_);
}

namespace {

// The largest id in n tokens of type T and the index of the first id >= limit (n when none). The
// max pass vectorises; the second pass runs only when a bad id exists.
template <class T>
std::pair<std::uint64_t, std::size_t> scan_ids(const unsigned char* bytes, std::size_t n, std::uint64_t limit) {
  const T* ids = reinterpret_cast<const T*>(bytes);   // mmap'ed: page-aligned
  T largest = 0;
  for (std::size_t i = 0; i < n; ++i) largest = std::max(largest, ids[i]);
  std::size_t first_bad = n;
  if (largest >= limit)
    for (std::size_t i = 0; i < n; ++i)
      if (ids[i] >= limit) {
        first_bad = i;
        break;
      }
  return {largest, first_bad};
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
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw Error(fmt::format("{}: cannot map token file '{}': {}", key, path, std::strerror(errno)));
  ::madvise(p, bytes, MADV_SEQUENTIAL);
  const auto* data = static_cast<const unsigned char*>(p);
  const auto limit = static_cast<std::uint64_t>(vocab);
  const auto [largest, first_bad] = width == 2 ? scan_ids<std::uint16_t>(data, bytes / 2, limit)
                                               : scan_ids<std::uint32_t>(data, bytes / 4, limit);
  std::uint64_t bad_id = 0;
  if (first_bad < bytes / width) {
    std::uint32_t v = 0;
    if (width == 2) {
      std::uint16_t u;
      std::memcpy(&u, data + first_bad * 2, 2);
      v = u;
    } else {
      std::memcpy(&v, data + first_bad * 4, 4);
    }
    bad_id = v;
  }
  ::munmap(p, bytes);
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
