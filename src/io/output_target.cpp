// The overwrite rule (output_target.h, docs/hdf5.md): what lmscale may replace, checked before any
// work and again just before the final rename.
#include "output_target.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#include <fmt/format.h>
#include <zlib.h>

#include "lmscale/io/weights_format.h"

namespace lmscale::io::detail {

namespace fs = std::filesystem;

namespace {

const char* kind_name(fs::file_type type) {
  switch (type) {
    case fs::file_type::directory: return "a directory";
    case fs::file_type::fifo: return "a FIFO (named pipe)";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::regular: return "a regular file";
    case fs::file_type::symlink: return "a symbolic link";
    default: return "not a regular file";
  }
}

// Why the entry at `path` (the target, or NAME.tmp) may not be replaced, or nullopt.
std::optional<std::string> replaceable(const std::string& path, OutputFormat format) {
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(path, ec);
  if (ec && link.type() != fs::file_type::not_found)
    return fmt::format("cannot be examined ({})", ec.message());
  if (link.type() == fs::file_type::not_found) return std::nullopt;   // a new name
  fs::file_type type = link.type();
  std::string prefix = "exists and is";
  if (type == fs::file_type::symlink) {
    const fs::file_status target = fs::status(path, ec);
    if (target.type() == fs::file_type::not_found) return std::nullopt;   // dangling: the link is replaced
    type = target.type();
    prefix = "is a symbolic link to";
  }
  if (type != fs::file_type::regular) return fmt::format("{} {}, not a regular file", prefix, kind_name(type));
  if (format == OutputFormat::metrics) {
    if (!is_empty_or_metrics(path))
      return fmt::format("{} a regular file that is not a metrics stream written by lmscale (run.metrics replaces "
                         "only its own streams and empty files)",
                         prefix);
    return std::nullopt;
  }
  if (format == OutputFormat::trace) {
    if (!is_empty_or_trace(path))
      return fmt::format("{} a regular file that is not a trace written by lmscale (run.trace replaces only its own "
                         "traces and empty files)",
                         prefix);
    return std::nullopt;
  }
  if (weights_format(path) == WeightsFormat::safetensors) {
    if (!is_empty_or_safetensors(path))
      return fmt::format("{} a regular file that is not a safetensors file (a name ending in .safetensors replaces only "
                         "safetensors files and empty files)",
                         prefix);
    return std::nullopt;
  }
  if (!is_empty_or_hdf5(path))
    return fmt::format("{} a regular file that is not an HDF5 file (lmscale replaces only HDF5 files and empty files)",
                       prefix);
  return std::nullopt;
}

// Why files cannot be created in the directory `dir` (absolute): it, or its nearest existing
// ancestor when it is missing (what is missing below is created with the file), must be a
// writable directory.
std::optional<std::string> creatable(fs::path dir) {
  std::error_code ec;
  while (true) {
    const fs::file_status st = fs::status(dir, ec);
    if (st.type() == fs::file_type::not_found) {
      if (!dir.has_relative_path()) return fmt::format("cannot be created: '{}' does not exist", dir.string());
      dir = dir.parent_path();
      continue;
    }
    if (st.type() != fs::file_type::directory)
      return fmt::format("cannot be created: '{}' is {}, not a directory", dir.string(), kind_name(st.type()));
    if (::access(dir.c_str(), W_OK | X_OK) != 0)
      return fmt::format("cannot be created: directory '{}' is not writable ({})", dir.string(), std::strerror(errno));
    return std::nullopt;
  }
}

}  // namespace

bool is_empty_or_hdf5(const std::string& path) {
  static constexpr char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return false;
  if (size == 0) return true;
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  // The superblock is at 0 or, after a user block, at 512, 1024, 2048, ... (HDF5 file format).
  for (std::uintmax_t offset = 0; offset + sizeof kSignature <= size; offset = offset == 0 ? 512 : offset * 2) {
    char head[sizeof kSignature] = {};
    in.seekg(static_cast<std::streamoff>(offset));
    if (!in.read(head, sizeof head)) return false;
    if (std::memcmp(head, kSignature, sizeof kSignature) == 0) return true;
  }
  return false;
}

bool is_empty_or_safetensors(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return false;
  if (size == 0) return true;
  std::ifstream in(path, std::ios::binary);
  unsigned char head[9] = {};
  if (size < sizeof head || !in || !in.read(reinterpret_cast<char*>(head), sizeof head)) return false;
  std::uintmax_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | head[i];
  return length >= 2 && length <= size - 8 && head[8] == '{';
}

namespace {
// A regular file that is empty or begins with `head`.
bool is_empty_or_begins(const std::string& path, std::string_view head) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return false;
  if (size == 0) return true;
  std::ifstream in(path, std::ios::binary);
  std::string got(head.size(), '\0');
  if (!in || !in.read(got.data(), static_cast<std::streamsize>(got.size()))) return false;
  return got == head;
}
}  // namespace

bool is_empty_or_metrics(const std::string& path) { return is_empty_or_begins(path, "{\"kind\": \"deck\""); }

bool is_empty_or_trace(const std::string& path) {
  static constexpr char kHead[] = "{\"traceEvents\"";
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return false;
  if (size == 0) return true;
  std::ifstream in(path, std::ios::binary);
  char head[sizeof kHead - 1] = {};
  if (!in || !in.read(head, 2)) return false;
  if (static_cast<unsigned char>(head[0]) == 0x1f && static_cast<unsigned char>(head[1]) == 0x8b) {
    // A gzip-compressed trace (NAME.json.gz): its text must begin the same way.
    gzFile gz = gzopen(path.c_str(), "rb");
    if (gz == nullptr) return false;
    const int n = gzread(gz, head, sizeof head);
    gzclose(gz);
    return n == static_cast<int>(sizeof head) && std::memcmp(head, kHead, sizeof head) == 0;
  }
  if (!in.read(head + 2, sizeof head - 2)) return false;
  return std::memcmp(head, kHead, sizeof head) == 0;
}

FileIdentity file_identity(const std::string& path) {
  FileIdentity id;
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(path), ec);
  if (ec) p = fs::path(path);
  const fs::path canonical = fs::weakly_canonical(p, ec);
  id.canonical = (ec ? p.lexically_normal() : canonical).string();
  while (id.canonical.size() > 1 && id.canonical.back() == '/') id.canonical.pop_back();
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0) {
    id.exists = true;
    id.device = static_cast<unsigned long long>(st.st_dev);
    id.inode = static_cast<unsigned long long>(st.st_ino);
  }
  return id;
}

bool same_file(const FileIdentity& a, const FileIdentity& b) {
  if (a.exists && b.exists) return a.device == b.device && a.inode == b.inode;
  return a.canonical == b.canonical;
}

bool lies_below(const FileIdentity& file, const FileIdentity& dir) {
  const std::string prefix = dir.canonical == "/" ? dir.canonical : dir.canonical + "/";
  return file.canonical.size() > prefix.size() && file.canonical.compare(0, prefix.size(), prefix) == 0;
}

std::optional<std::string> replace_problem(const std::string& path, OutputFormat format) {
  return replaceable(path, format);
}

std::optional<std::string> output_problem(const std::string& path, OutputFormat format) {
  if (path.empty()) return std::string("is empty");
  if (path.back() == '/') return std::string("names a directory (ends with '/'); give a file name");
  if (auto problem = replaceable(path, format)) return problem;
  const std::string tmp = path + ".tmp";
  if (auto problem = replaceable(tmp, format)) return fmt::format("cannot be written because '{}' {}", tmp, *problem);

  std::error_code ec;
  const fs::path dir = fs::absolute(fs::path(path), ec).parent_path();
  if (ec) return fmt::format("cannot be resolved ({})", ec.message());
  return creatable(dir);
}

std::optional<std::string> directory_problem(const std::string& dir) {
  if (dir.empty()) return std::string("is empty");
  std::error_code ec;
  const fs::path abs = fs::absolute(fs::path(dir), ec);
  if (ec) return fmt::format("cannot be resolved ({})", ec.message());
  if (fs::is_directory(abs, ec)) {
    if (::access(abs.c_str(), W_OK | X_OK) != 0)
      return fmt::format("is a directory this process cannot write to ({})", errno_text(errno));
    return std::nullopt;
  }
  return creatable(abs);
}

std::string errno_text(int e) {
  const char* name = "";
  switch (e) {
    case ENOSPC: name = "ENOSPC"; break;
    case EFBIG: name = "EFBIG"; break;
    case EDQUOT: name = "EDQUOT"; break;
    case EIO: name = "EIO"; break;
    case EROFS: name = "EROFS"; break;
    case EACCES: name = "EACCES"; break;
    case EPERM: name = "EPERM"; break;
    case EEXIST: name = "EEXIST"; break;
    case ELOOP: name = "ELOOP"; break;
    case ENOENT: name = "ENOENT"; break;
    default: break;
  }
  return fmt::format("{} (errno {}{}{})", std::strerror(e), e, *name ? ", " : "", name);
}

}  // namespace lmscale::io::detail
