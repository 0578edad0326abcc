#include "lmscale/io/text_data.h"

#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/core/rng.h"
#include "sample_key.h"

namespace lmscale::io {

std::size_t utf8_invalid_offset(const unsigned char* s, std::size_t n) {
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Lead byte: length and the allowed range of the second byte (RFC 3629 table), which
    // excludes overlong forms (C0, C1, E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and
    // code points above U+10FFFF (F4 90.., F5..FF).
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else return i;
    if (i + len > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    i += len;
  }
  return n;
}

double unigram_entropy(const unsigned char* data, std::size_t n) {
  if (n == 0) return 0;
  std::array<std::size_t, 256> count{};
  for (std::size_t i = 0; i < n; ++i) ++count[data[i]];
  double h = 0;
  for (const std::size_t c : count)
    if (c > 0) {
      const double p = static_cast<double>(c) / static_cast<double>(n);
      h -= p * std::log(p);
    }
  return h;
}

namespace {

std::vector<unsigned char> read_all(const std::string& key, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open text file '{}': {}", key, path, std::strerror(errno)));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Bytes of the validation tail: floor(n * fraction).
std::size_t tail_bytes(std::size_t n, double fraction) {
  return static_cast<std::size_t>(std::floor(static_cast<double>(n) * fraction));
}

}  // namespace

TextBytes::TextBytes(const std::string& path, const std::string& val_path, double val_fraction, std::uint64_t seed)
    : path_(path), val_path_(val_path == path ? std::string() : val_path), seed_(seed) {
  text_ = read_all("data.path", path);
  if (!val_path_.empty()) {
    val_text_ = read_all("data.val_path", val_path_);
    train_end_ = text_.size();
  } else {
    train_end_ = text_.size() - tail_bytes(text_.size(), val_fraction);
  }
  entropy_ = unigram_entropy(text_.data(), train_end_);
}

std::size_t TextBytes::val_bytes() const { return val_path_.empty() ? text_.size() - train_end_ : val_text_.size(); }

void TextBytes::sample(std::uint64_t step, std::int64_t first, std::int64_t rows, std::int64_t T, std::int32_t* out,
                       bool eval) const {
  // The span samples are drawn from: training bytes, the validation file, or the tail (the
  // training bytes again when data.val_fraction = 0 and no data.val_path).
  const unsigned char* base = text_.data();
  std::size_t n = train_end_;
  if (eval && !val_path_.empty()) {
    base = val_text_.data();
    n = val_text_.size();
  } else if (eval && train_end_ < text_.size()) {
    base = text_.data() + train_end_;
    n = text_.size() - train_end_;
  }
  const auto len = static_cast<std::int64_t>(n);
  if (len < T + 2)
    throw Error(fmt::format("text file '{}': {} {} bytes, fewer than model.context_length + 2", path_, len,
                            eval ? "validation" : "training"));
  for (std::int64_t r = 0; r < rows; ++r) {
    const CounterRng rng(seed_, detail::sample_key(step, first + r, eval));
    const auto start = static_cast<std::int64_t>(rng.below(0, static_cast<std::uint64_t>(len - T - 1)));
    for (std::int64_t t = 0; t <= T; ++t) out[r * (T + 1) + t] = base[start + t];
  }
}

std::string TextBytes::describe() const {
  return fmt::format("text {} (bytes as tokens: {} training, {} validation{}; unigram entropy {:.3f} nats/byte)",
                     path_, train_end_, val_bytes(), val_path_.empty() ? " from the tail" : " from " + val_path_,
                     entropy_);
}

std::map<std::string, double> TextBytes::attributes() const {
  return {{"unigram_entropy", entropy_},
          {"train_bytes", static_cast<double>(train_end_)},
          {"val_bytes", static_cast<double>(val_bytes())}};
}

void check_text_file(const std::string& key, const std::string& path, double val_fraction, std::int64_t min_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw UsageError(fmt::format("{} = '{}' cannot be opened: {}; fix the path", key, path, std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw UsageError(fmt::format("{} = '{}' is not a regular file; give a UTF-8 text file", key, path));
  if (st.st_size == 0)
    throw UsageError(fmt::format("{} = '{}' is empty; give a UTF-8 text file with at least {} bytes", key, path,
                                 min_bytes));
  std::vector<unsigned char> text;
  try {
    text = read_all(key, path);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  const std::size_t bad = utf8_invalid_offset(text.data(), text.size());
  if (bad < text.size())
    throw UsageError(fmt::format("{} = '{}' is not valid UTF-8: byte {} (0x{:02X}) does not start or continue a "
                                 "valid sequence; convert the file to UTF-8 (e.g. iconv -t UTF-8) or use "
                                 "data.source = tokens for binary token files",
                                 key, path, bad, text[bad]));
  const std::size_t n = text.size(), val = tail_bytes(n, val_fraction);
  const auto need = static_cast<std::size_t>(min_bytes);
  if (n - val < need)
    throw UsageError(fmt::format("{} = '{}' holds {} bytes, {} of them for training, but model.context_length needs "
                                 "at least {} (context_length + 2); use a longer text, a smaller "
                                 "model.context_length or a smaller data.val_fraction",
                                 key, path, n, n - val, need));
  if (val > 0 && val < need)
    throw UsageError(fmt::format("{} = '{}': the validation tail (data.val_fraction = {} of {} bytes) holds {} bytes, "
                                 "fewer than context_length + 2 = {}; raise data.val_fraction, or set it to 0 "
                                 "(evaluate on the training text)",
                                 key, path, val_fraction, n, val, need));
}

}  // namespace lmscale::io
