#include "lmscale/io/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/core/rng.h"

namespace lmscale::io {

namespace {
constexpr std::uint64_t kEvalKey = 0xe7a1e7a1e7a1ull;
std::uint64_t sample_key(std::uint64_t step, std::int64_t index, bool eval) {
  return splitmix64(step * 0x100000001b3ull + static_cast<std::uint64_t>(index)) ^ (eval ? kEvalKey : 0);
}
}  // namespace

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

TokenFile::TokenFile(const std::string& path, const std::string& val_path, const std::string& dtype,
                     std::int64_t vocab, std::uint64_t seed)
    : width_(dtype == "uint32" ? 4 : 2), vocab_(vocab), seed_(seed) {
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

std::unique_ptr<TokenSource> make_token_source(const DataConfig& cfg, std::int64_t vocab, std::uint64_t seed) {
  if (cfg.source == "tokens") return std::make_unique<TokenFile>(cfg.path, cfg.val_path, cfg.dtype, vocab, seed);
  return std::make_unique<SyntheticTokens>(vocab, seed);
}

}  // namespace lmscale::io
