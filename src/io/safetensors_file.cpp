// safetensors weights files (include/lmscale/io/safetensors_file.h, docs/hdf5.md): our own small
// writer and reader of the format's header subset (no JSON library is a dependency).
#include "lmscale/io/safetensors_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "h5_support.h"
#include "json_text.h"
#include "lmscale/core/error.h"
#include "output_target.h"

namespace lmscale::io {

static_assert(std::endian::native == std::endian::little, "safetensors data are little-endian: a big-endian host needs byte swaps");

namespace {

namespace fs = std::filesystem;

// A header larger than this is refused before it is read (the format's own reader uses 100 MB).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

std::string shape_text(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F64") return 8;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

// Writes all of `data` to `fd`; false with errno set on failure.
bool write_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool read_at(int fd, char* out, std::size_t n, std::uint64_t offset) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    out += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
  return true;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  float magnitude;
  if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -24);          // subnormal or zero
  else if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
  else magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  return sign ? -magnitude : magnitude;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedArray>& params,
                       const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      header += (first ? "" : ",") + json::quote(key) + ":" + json::quote(value);
      first = false;
    }
    header += "}";
  }
  std::set<std::string> seen;
  std::uint64_t offset = 0;
  for (const auto& p : params) {
    if (p.name.empty() || p.name == "__metadata__" || !seen.insert(p.name).second)
      throw Error(fmt::format("safetensors '{}': tensor name '{}' is empty, reserved or given twice", path, p.name));
    std::uint64_t count = 1;
    for (auto d : p.shape) {
      if (d < 0) throw Error(fmt::format("safetensors '{}': tensor '{}' has a negative dimension in {}", path, p.name, shape_text(p.shape)));
      count *= static_cast<std::uint64_t>(d);
    }
    if (count > 0 && p.data == nullptr) throw Error(fmt::format("safetensors '{}': tensor '{}' has no data", path, p.name));
    const std::uint64_t bytes = count * sizeof(float);
    header += fmt::format("{}{}:{{\"dtype\":\"F32\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", header.size() > 1 ? "," : "",
                          json::quote(p.name), fmt::join(p.shape, ","), offset, offset + bytes);
    offset += bytes;
  }
  header += "}";
  // Spaces after the JSON so that the data start at a multiple of 8 bytes (as the format's writer).
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string tmp = h5::temporary_path(path);
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (ec) throw Error(fmt::format("cannot create directory '{}' for '{}': {}", parent.string(), path, ec.message()));
  const fs::file_type stale = fs::symlink_status(tmp, ec).type();
  if ((stale == fs::file_type::regular || stale == fs::file_type::symlink) && !fs::remove(tmp, ec))
    throw Error(fmt::format("cannot remove the stale '{}': {}", tmp, ec.message()));
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) throw Error(fmt::format("cannot create '{}': {}", tmp, detail::errno_text(errno)));
  auto fail = [&](int e) {
    ::close(fd.release());
    fs::remove(tmp, ec);   // a half-written weights file is of no use
    throw Error(fmt::format("writing '{}' failed: {}", tmp, detail::errno_text(e)));
  };
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>((static_cast<std::uint64_t>(header.size()) >> (8 * i)) & 0xFF);
  if (!write_all(fd.get(), reinterpret_cast<const char*>(length), sizeof length)) fail(errno);
  if (!write_all(fd.get(), header.data(), header.size())) fail(errno);
  for (const auto& p : params) {
    std::uint64_t count = 1;
    for (auto d : p.shape) count *= static_cast<std::uint64_t>(d);
    if (count > 0 && !write_all(fd.get(), reinterpret_cast<const char*>(p.data), count * sizeof(float))) fail(errno);
  }
  if (::close(fd.release()) != 0) {
    const int e = errno;
    fs::remove(tmp, ec);
    throw Error(fmt::format("writing '{}' failed: {}", tmp, detail::errno_text(e)));
  }
  h5::commit_file(tmp, path);   // the overwrite rule once more, then the rename
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  auto bad = [&](const std::string& what) { return Error(fmt::format("safetensors '{}': {}", path, what)); };
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw bad(fmt::format("cannot open: {}", detail::errno_text(errno)));
  std::error_code ec;
  const std::uint64_t size = fs::file_size(path, ec);
  if (ec) throw bad(fmt::format("cannot get its size: {}", ec.message()));
  unsigned char length[8];
  if (size < 8 || !read_at(fd.get(), reinterpret_cast<char*>(length), 8, 0))
    throw bad(fmt::format("the file has {} bytes, fewer than the 8 of the header length", size));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length[i];
  if (n > kMaxHeaderBytes || n > size - 8)
    throw bad(fmt::format("the header length {} runs past the end of the {}-byte file (or over 100 MB): not a "
                          "safetensors file, or a truncated one",
                          n, size));
  std::string text(n, '\0');
  if (n > 0 && !read_at(fd.get(), text.data(), n, 8)) throw bad("the header cannot be read");
  data_start_ = 8 + n;
  const std::uint64_t data_bytes = size - data_start_;
  json::Value header;
  try {
    header = json::parse(text);
  } catch (const Error& e) {
    throw bad(fmt::format("the header is not valid JSON ({})", e.what()));
  }
  if (header.kind != json::Value::Kind::object) throw bad("the header is not a JSON object");
  for (const auto& [name, value] : header.object) {
    if (name == "__metadata__") {
      if (value.kind != json::Value::Kind::object) throw bad("\"__metadata__\" is not an object");
      for (const auto& [key, text_value] : value.object) {
        if (text_value.kind != json::Value::Kind::string)
          throw bad(fmt::format("metadata key \"{}\" is not a string", key));
        metadata_[key] = text_value.string;
      }
      continue;
    }
    auto tensor = [&](const std::string& what) { return bad(fmt::format("tensor \"{}\": {}", name, what)); };
    if (value.kind != json::Value::Kind::object) throw tensor("not an object");
    Entry e;
    e.name = name;
    const json::Value* dtype = value.find("dtype");
    const json::Value* shape = value.find("shape");
    const json::Value* offsets = value.find("data_offsets");
    if (!dtype || dtype->kind != json::Value::Kind::string) throw tensor("\"dtype\" missing or not a string");
    e.dtype = dtype->string;
    const std::size_t element = dtype_bytes(e.dtype);
    if (element == 0) throw tensor(fmt::format("dtype \"{}\" is not one of F32, F64, F16, BF16", e.dtype));
    if (!shape || shape->kind != json::Value::Kind::array) throw tensor("\"shape\" missing or not an array");
    std::uint64_t count = 1;
    for (const auto& d : shape->array) {
      if (d.kind != json::Value::Kind::integer || d.integer < 0) throw tensor("\"shape\" holds a value that is not a non-negative integer");
      e.shape.push_back(d.integer);
      if (d.integer > 0 && count > (std::uint64_t{1} << 62) / static_cast<std::uint64_t>(d.integer)) throw tensor("\"shape\" is too large");
      count *= static_cast<std::uint64_t>(d.integer);
    }
    if (!offsets || offsets->kind != json::Value::Kind::array || offsets->array.size() != 2 ||
        offsets->array[0].kind != json::Value::Kind::integer || offsets->array[1].kind != json::Value::Kind::integer ||
        offsets->array[0].integer < 0 || offsets->array[1].integer < offsets->array[0].integer)
      throw tensor("\"data_offsets\" is not [begin, end] with 0 <= begin <= end");
    e.begin = static_cast<std::uint64_t>(offsets->array[0].integer);
    e.end = static_cast<std::uint64_t>(offsets->array[1].integer);
    if (e.end - e.begin != count * element)
      throw tensor(fmt::format("\"data_offsets\" [{}, {}] hold {} bytes but shape {} of {} needs {}", e.begin, e.end,
                               e.end - e.begin, shape_text(e.shape), e.dtype, count * element));
    if (e.end > data_bytes)
      throw tensor(fmt::format("\"data_offsets\" end {} is past the {} bytes of data (a truncated file?)", e.end, data_bytes));
    entries_.push_back(std::move(e));
  }
  // No two tensors may share bytes.
  std::vector<const Entry*> by_offset;
  for (const auto& e : entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      throw bad(fmt::format("tensors \"{}\" and \"{}\" overlap in the data", by_offset[i - 1]->name, by_offset[i]->name));
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> names;
  for (const auto& e : entries_) names.push_back(e.name);
  return names;
}

bool SafetensorsReader::has(const std::string& name) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; });
}

const SafetensorsReader::Entry& SafetensorsReader::entry(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return e;
  throw Error(fmt::format("safetensors '{}': tensor '{}' not found ({} tensors in the file)", path_, name, entries_.size()));
}

std::vector<std::int64_t> SafetensorsReader::shape(const std::string& name) const { return entry(name).shape; }

void SafetensorsReader::read(const std::string& name, const std::vector<std::int64_t>& expected_shape, float* out) const {
  const Entry& e = entry(name);
  if (e.shape != expected_shape)
    throw Error(fmt::format("safetensors '{}': tensor '{}' has shape {} in the file but {} is expected", path_, name,
                            shape_text(e.shape), shape_text(expected_shape)));
  const std::uint64_t bytes = e.end - e.begin;
  if (bytes == 0) return;
  if (out == nullptr) throw Error(fmt::format("safetensors '{}': null output buffer for '{}'", path_, name));
  Fd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw Error(fmt::format("safetensors '{}': cannot open: {}", path_, detail::errno_text(errno)));
  const std::uint64_t at = data_start_ + e.begin;
  if (e.dtype == "F32") {
    if (!read_at(fd.get(), reinterpret_cast<char*>(out), bytes, at))
      throw Error(fmt::format("safetensors '{}': reading tensor '{}' failed (a truncated file?)", path_, name));
    return;
  }
  std::vector<char> raw(bytes);
  if (!read_at(fd.get(), raw.data(), bytes, at))
    throw Error(fmt::format("safetensors '{}': reading tensor '{}' failed (a truncated file?)", path_, name));
  const std::size_t count = bytes / dtype_bytes(e.dtype);
  for (std::size_t i = 0; i < count; ++i) {
    if (e.dtype == "F64") {
      double v;
      std::memcpy(&v, raw.data() + 8 * i, 8);
      out[i] = static_cast<float>(v);
    } else {
      std::uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      if (e.dtype == "BF16") {
        const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
        std::memcpy(&out[i], &bits, 4);
      } else {
        out[i] = half_to_float(h);
      }
    }
  }
}

}  // namespace lmscale::io
