#include "h5_support.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lmscale/core/error.h"
#include "output_target.h"

namespace lmscale::io::h5 {

namespace {

// Collects the descriptions of the error stack, innermost (where it failed) first.
herr_t collect_error(unsigned n, const H5E_error2_t* err, void* data) {
  try {   // no exception may cross the C library's frames
    auto* messages = static_cast<std::vector<std::string>*>(data);
    messages->push_back(fmt::format("{} ({})", err->desc ? err->desc : "", err->func_name ? err->func_name : "?"));
    (void)n;
    return 0;
  } catch (...) {
    return -1;
  }
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= path.size()) {
    const auto slash = path.find('/', start);
    const std::string part = path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (!part.empty()) parts.push_back(part);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return parts;
}

std::atomic<bool> g_close_failed{false};

// The value after `key` in HDF5's file-driver message ("..., errno = 28, error message = 'No
// space left on device', ..."); "" when absent.
std::string driver_field(const std::string& message, const std::string& key) {
  const auto at = message.find(key);
  if (at == std::string::npos) return "";
  auto begin = at + key.size();
  if (begin < message.size() && message[begin] == '\'') {
    const auto end = message.find('\'', begin + 1);
    return end == std::string::npos ? "" : message.substr(begin + 1, end - begin - 1);
  }
  const auto end = message.find_first_of(", ", begin);
  return message.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// The sec2 driver's read or write failures carry the system's errno inside a long multi-line
// message; say it in one line: "writing 'out.h5.tmp' failed: No space left on device (errno 28,
// ENOSPC)". Other messages are kept as they are.
std::string tidy(const std::string& message) {
  const std::string number = driver_field(message, "errno = ");
  if (number.empty()) return message;
  int e = 0;
  try {
    e = std::stoi(number);
  } catch (const std::exception&) {
    return message;
  }
  const std::string file = driver_field(message, "filename = ");
  const bool write = message.find("write failed") != std::string::npos;
  return fmt::format("{} '{}' failed: {}", write ? "writing" : "reading", file, detail::errno_text(e));
}

}  // namespace

hid_t check(hid_t id, const std::string& what) {
  if (id >= 0) return id;
  std::vector<std::string> messages;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &messages);
  H5Eclear2(H5E_DEFAULT);
  // The innermost message says where it failed; a system error (errno) anywhere in the stack is
  // the cause worth naming.
  for (const auto& m : messages)
    if (m.find("errno = ") != std::string::npos) throw Error(fmt::format("HDF5: {}: {}", what, tidy(m)));
  throw Error(fmt::format("HDF5: {}: {}", what, messages.empty() ? std::string("failed") : messages.front()));
}

void note_close_failure() noexcept { g_close_failed.store(true); }

bool close_failed() noexcept { return g_close_failed.load(); }

herr_t close_quietly(herr_t (*close)(hid_t), hid_t id) noexcept {
  H5E_auto2_t func = nullptr;
  void* data = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &func, &data);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const herr_t status = close(id);
  if (status < 0) {
    note_close_failure();
    H5Eclear2(H5E_DEFAULT);
  }
  H5Eset_auto2(H5E_DEFAULT, func, data);
  return status;
}

void check_status(herr_t status, const std::string& what) { check(status < 0 ? H5I_INVALID_HID : 0, what); }

QuietErrors::QuietErrors() {
  H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

QuietErrors::~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

Datatype fixed_string_type(std::size_t size) {
  Datatype type(H5Tcopy(H5T_C_S1), "copy string type");
  check_status(H5Tset_size(type.get(), size), "set string size");
  check_status(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), "set string padding");
  return type;
}

Datatype variable_string_type() {
  Datatype type(H5Tcopy(H5T_C_S1), "copy string type");
  check_status(H5Tset_size(type.get(), H5T_VARIABLE), "set variable string size");
  check_status(H5Tset_cset(type.get(), H5T_CSET_UTF8), "set UTF-8");
  return type;
}

bool exists(hid_t loc, const std::string& path) {
  std::string prefix;
  for (const auto& part : split_path(path)) {
    prefix += "/" + part;
    const htri_t found = H5Lexists(loc, prefix.c_str(), H5P_DEFAULT);
    check_status(found, fmt::format("look up '{}'", prefix));
    if (found == 0) return false;
  }
  return true;
}

PropertyList intermediate_groups() {
  PropertyList lcpl(H5Pcreate(H5P_LINK_CREATE), "create link properties");
  check_status(H5Pset_create_intermediate_group(lcpl.get(), 1), "set intermediate group creation");
  check_status(H5Pset_char_encoding(lcpl.get(), H5T_CSET_UTF8), "set UTF-8 link names");
  return lcpl;
}

bool is_dataset(hid_t loc, const std::string& path) {
  if (!exists(loc, path)) return false;
  const Object object(H5Oopen(loc, path.c_str(), H5P_DEFAULT), fmt::format("open '{}'", path));
  return H5Iget_type(object.get()) == H5I_DATASET;
}

void write_f32(hid_t loc, const std::string& path, const std::vector<std::int64_t>& shape, const float* data,
               const std::string& what) {
  std::vector<hsize_t> dims;
  hsize_t count = 1;
  for (auto d : shape) {
    if (d < 0) throw Error(fmt::format("{}: negative dimension in shape [{}]", what, fmt::join(shape, ", ")));
    dims.push_back(static_cast<hsize_t>(d));
    count *= static_cast<hsize_t>(d);
  }
  if (count > 0 && data == nullptr) throw Error(fmt::format("{}: null data", what));
  const Dataspace space(dims.empty() ? H5Screate(H5S_SCALAR)
                                     : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                        what);
  const PropertyList lcpl = intermediate_groups();
  const Dataset dataset(H5Dcreate2(loc, path.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                        what);
  if (count > 0) check_status(H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), what);
}

std::vector<std::int64_t> dataset_shape(hid_t loc, const std::string& path, const std::string& what) {
  if (!is_dataset(loc, path)) throw Error(fmt::format("{}: no dataset '{}'", what, path));
  const Dataset dataset(H5Dopen2(loc, path.c_str(), H5P_DEFAULT), what);
  const Dataspace space(H5Dget_space(dataset.get()), what);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  check_status(rank < 0 ? -1 : 0, what);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0) check_status(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), what);
  return {dims.begin(), dims.end()};
}

void read_f32(hid_t loc, const std::string& path, const std::vector<std::int64_t>& expected_shape, float* out,
              const std::string& what) {
  const auto shape = dataset_shape(loc, path, what);
  if (shape != expected_shape)
    throw Error(fmt::format("{}: shape [{}] in the file but [{}] is expected", what, fmt::join(shape, ", "),
                            fmt::join(expected_shape, ", ")));
  std::int64_t count = 1;
  for (auto d : shape) count *= d;
  if (count == 0) return;
  if (out == nullptr) throw Error(fmt::format("{}: null output buffer", what));
  const Dataset dataset(H5Dopen2(loc, path.c_str(), H5P_DEFAULT), what);
  check_status(H5Dread(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out), what);
}

Object open_or_create_group(hid_t file, const std::string& path) {
  const auto parts = split_path(path);
  if (parts.empty()) return Object(H5Oopen(file, "/", H5P_DEFAULT), "open '/'");
  if (!exists(file, path)) {
    const PropertyList lcpl = intermediate_groups();
    Group created(H5Gcreate2(file, path.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                  fmt::format("create group '{}'", path));
  }
  return Object(H5Oopen(file, path.c_str(), H5P_DEFAULT), fmt::format("open '{}'", path));
}

void write_attr(hid_t obj, const std::string& name, const AttrValue& value) {
  const htri_t found = H5Aexists(obj, name.c_str());
  check_status(found, fmt::format("look up attribute '{}'", name));
  if (found > 0) check_status(H5Adelete(obj, name.c_str()), fmt::format("replace attribute '{}'", name));
  const std::string what = fmt::format("write attribute '{}'", name);
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          const Datatype type = variable_string_type();
          const Dataspace space(H5Screate(H5S_SCALAR), what);
          const Attribute attr(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), what);
          const char* text = v.c_str();
          check_status(H5Awrite(attr.get(), type.get(), &text), what);
        } else if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, double>) {
          const bool integer = std::is_same_v<T, std::int64_t>;
          const Dataspace space(H5Screate(H5S_SCALAR), what);
          const Attribute attr(H5Acreate2(obj, name.c_str(), integer ? H5T_STD_I64LE : H5T_IEEE_F64LE, space.get(),
                                          H5P_DEFAULT, H5P_DEFAULT),
                               what);
          check_status(H5Awrite(attr.get(), integer ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, &v), what);
        } else {
          const bool integer = std::is_same_v<T, std::vector<std::int64_t>>;
          const hsize_t n = v.size();
          const Dataspace space(H5Screate_simple(1, &n, nullptr), what);
          const Attribute attr(H5Acreate2(obj, name.c_str(), integer ? H5T_STD_I64LE : H5T_IEEE_F64LE, space.get(),
                                          H5P_DEFAULT, H5P_DEFAULT),
                               what);
          if (n > 0) check_status(H5Awrite(attr.get(), integer ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, v.data()), what);
        }
      },
      value);
}

void write_string_array_attr(hid_t obj, const std::string& name, const std::vector<std::string>& values) {
  const std::string what = fmt::format("write attribute '{}'", name);
  const htri_t found = H5Aexists(obj, name.c_str());
  check_status(found, what);
  if (found > 0) check_status(H5Adelete(obj, name.c_str()), what);
  std::vector<const char*> pointers;
  for (const auto& v : values) pointers.push_back(v.c_str());
  const Datatype type = variable_string_type();
  const hsize_t n = values.size();
  const Dataspace space(H5Screate_simple(1, &n, nullptr), what);
  const Attribute attr(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), what);
  if (n > 0) check_status(H5Awrite(attr.get(), type.get(), pointers.data()), what);
}

AttrValue read_attr(hid_t obj, const std::string& name) {
  const std::string what = fmt::format("read attribute '{}'", name);
  const Attribute attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), what);
  const Datatype type(H5Aget_type(attr.get()), what);
  const Dataspace space(H5Aget_space(attr.get()), what);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  check_status(rank < 0 || n < 0 ? -1 : 0, what);
  const H5T_class_t cls = H5Tget_class(type.get());
  if (cls == H5T_STRING && rank == 0) {
    if (H5Tis_variable_str(type.get()) > 0) {
      const Datatype memtype = variable_string_type();
      char* text = nullptr;
      check_status(H5Aread(attr.get(), memtype.get(), &text), what);
      std::string result = text ? text : "";
      H5free_memory(text);
      return result;
    }
    const std::size_t size = H5Tget_size(type.get());
    std::string result(size, '\0');
    const Datatype memtype = fixed_string_type(size);
    check_status(H5Aread(attr.get(), memtype.get(), result.data()), what);
    return result.substr(0, result.find('\0'));
  }
  if ((cls == H5T_INTEGER || cls == H5T_FLOAT) && rank <= 1) {
    if (cls == H5T_INTEGER) {
      std::vector<std::int64_t> values(static_cast<std::size_t>(n));
      if (n > 0) check_status(H5Aread(attr.get(), H5T_NATIVE_INT64, values.data()), what);
      if (rank == 0) return values.at(0);
      return values;
    }
    std::vector<double> values(static_cast<std::size_t>(n));
    if (n > 0) check_status(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, values.data()), what);
    if (rank == 0) return values.at(0);
    return values;
  }
  throw Error(fmt::format("HDF5: attribute '{}' is not a number, string or 1-D numeric array", name));
}

std::vector<std::string> attr_names(hid_t obj) {
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
    try {   // no exception may cross the C library's frames
      static_cast<std::vector<std::string>*>(data)->push_back(name);
      return 0;
    } catch (...) {
      return -1;
    }
  };
  check_status(H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names), "list attributes");
  return names;
}

PropertyList file_access_properties() {
  PropertyList fapl(H5Pcreate(H5P_FILE_ACCESS), "create file access properties");
  check_status(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG), "set strong close");
#if H5_VERSION_GE(1, 10, 7)
  // Lock the file where the file system supports it, and go on where it does not (NFS and
  // Lustre mounts without flock make H5Fcreate/H5Fopen fail otherwise).
  check_status(H5Pset_file_locking(fapl.get(), true, true), "set file locking");
#endif
  return fapl;
}

File create_file(const std::string& path, bool track_creation_order, std::vector<std::string>* created_dirs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // Missing directories, outermost last, so that an abandoned file can take them away again.
  std::vector<fs::path> missing;
  for (fs::path dir = fs::path(path).parent_path(); !dir.empty() && dir.has_relative_path(); dir = dir.parent_path()) {
    if (fs::symlink_status(dir, ec).type() != fs::file_type::not_found) break;
    missing.push_back(dir);
  }
  const fs::path parent = fs::path(path).parent_path();
  if (!missing.empty()) fs::create_directories(parent, ec);
  if (ec) throw Error(fmt::format("cannot create directory '{}' for '{}': {}", parent.string(), path, ec.message()));
  if (created_dirs)
    for (const auto& dir : missing) created_dirs->push_back(dir.string());
  // A NAME.tmp left by a stopped run is removed (a link is removed, never written through), and
  // the file is created exclusively: nothing that exists is truncated.
  const fs::file_type existing = fs::symlink_status(path, ec).type();
  if (existing == fs::file_type::regular || existing == fs::file_type::symlink) {
    if (!fs::remove(path, ec) || ec)
      throw Error(fmt::format("cannot remove the stale '{}': {}", path, ec ? ec.message() : "not removed"));
  } else if (existing != fs::file_type::not_found) {
    throw Error(fmt::format("cannot create '{}': it exists and is not a regular file", path));
  }
  const PropertyList fapl = file_access_properties();
  PropertyList fcpl(H5Pcreate(H5P_FILE_CREATE), "create file creation properties");
  if (track_creation_order)
    check_status(H5Pset_link_creation_order(fcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED),
                 "track creation order");
  return File(H5Fcreate(path.c_str(), H5F_ACC_EXCL, fcpl.get(), fapl.get()), fmt::format("create '{}'", path));
}

void remove_abandoned(const std::string& path, const std::vector<std::string>& created_dirs) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  for (const auto& dir : created_dirs) {   // innermost first; only while empty
    if (!std::filesystem::is_empty(dir, ec) || ec) break;
    std::filesystem::remove(dir, ec);
  }
}

std::string temporary_path(const std::string& path) { return path + ".tmp"; }

void commit_file(const std::string& tmp, const std::string& path) {
  // The overwrite rule once more: the target may have changed since the deck was validated.
  if (const auto problem = detail::replace_problem(path))
    throw Error(fmt::format("'{}' {}: it is left as it is and the complete file is kept as '{}'", path, *problem, tmp));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(fmt::format("cannot rename '{}' to '{}': {} (the complete file is kept as '{}')", tmp, path,
                                  ec.message(), tmp));
}

std::string utc_now_iso8601() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string library_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return fmt::format("{}.{}.{}", major, minor, release);
}

}  // namespace lmscale::io::h5
