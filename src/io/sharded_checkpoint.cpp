// Sharded training checkpoints (include/lmscale/io/sharded_checkpoint.h, docs/checkpoints.md).
#include "lmscale/io/sharded_checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <set>
#include <filesystem>
#include <regex>

#include <fmt/format.h>

#include "h5_support.h"
#include "lmscale/core/error.h"
#include "lmscale/version.h"

namespace lmscale::io {

namespace fs = std::filesystem;

const char* state_kind_name(StateKind k) {
  switch (k) {
    case StateKind::master: return "master";
    case StateKind::m: return "m";
    case StateKind::v: return "v";
  }
  return "?";
}

std::string checkpoint_step_dir(const std::string& dir, std::int64_t step) {
  return (fs::path(dir) / fmt::format("step_{:08}", step)).string();
}

std::string shard_file_name(int rank) { return fmt::format("rank_{:05}.h5", rank); }

namespace {

constexpr StateKind kKinds[] = {StateKind::master, StateKind::m, StateKind::v};
// Chunks of 1 Mi elements (4 MiB): each carries its own checksum, and a partial read touches few.
constexpr hsize_t kChunk = 1 << 20;

void write_i64(hid_t file, const std::string& name, const std::vector<std::int64_t>& values, const std::string& what) {
  const hsize_t n = values.size();
  const h5::Dataspace space(H5Screate_simple(1, &n, nullptr), what);
  const h5::PropertyList lcpl = h5::intermediate_groups();
  const h5::Dataset d(H5Dcreate2(file, name.c_str(), H5T_STD_I64LE, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                      what);
  if (n > 0) h5::check_status(H5Dwrite(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), what);
}

void write_strings(hid_t file, const std::string& name, const std::vector<std::string>& values, const std::string& what) {
  std::size_t size = 1;
  for (const auto& s : values) size = std::max(size, s.size());
  std::vector<char> buffer(values.size() * size, '\0');
  for (std::size_t i = 0; i < values.size(); ++i) std::copy(values[i].begin(), values[i].end(), buffer.data() + i * size);
  const hsize_t n = values.size();
  const h5::Dataspace space(H5Screate_simple(1, &n, nullptr), what);
  const h5::Datatype type = h5::fixed_string_type(size);
  const h5::PropertyList lcpl = h5::intermediate_groups();
  const h5::Dataset d(H5Dcreate2(file, name.c_str(), type.get(), space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), what);
  if (n > 0) h5::check_status(H5Dwrite(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer.data()), what);
}

hsize_t length(hid_t dataset, const std::string& what) {
  const h5::Dataspace space(H5Dget_space(dataset), what);
  if (H5Sget_simple_extent_ndims(space.get()) != 1) throw Error(fmt::format("{}: not a 1-D dataset", what));
  hsize_t n = 0;
  h5::check_status(H5Sget_simple_extent_dims(space.get(), &n, nullptr), what);
  return n;
}

std::vector<std::int64_t> read_i64(hid_t file, const std::string& name, const std::string& file_path) {
  const std::string what = fmt::format("checkpoint file '{}': read '{}'", file_path, name);
  if (!h5::exists(file, name)) throw Error(fmt::format("checkpoint file '{}' lacks dataset '{}'", file_path, name));
  const h5::Dataset d(H5Dopen2(file, name.c_str(), H5P_DEFAULT), what);
  std::vector<std::int64_t> v(length(d.get(), what));
  if (!v.empty()) h5::check_status(H5Dread(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), what);
  return v;
}

std::vector<std::string> read_strings(hid_t file, const std::string& name, const std::string& file_path) {
  const std::string what = fmt::format("checkpoint file '{}': read '{}'", file_path, name);
  if (!h5::exists(file, name)) throw Error(fmt::format("checkpoint file '{}' lacks dataset '{}'", file_path, name));
  const h5::Dataset d(H5Dopen2(file, name.c_str(), H5P_DEFAULT), what);
  const hsize_t n = length(d.get(), what);
  const h5::Datatype type(H5Dget_type(d.get()), what);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) != 0)
    throw Error(fmt::format("{}: not fixed-length strings", what));
  const std::size_t size = H5Tget_size(type.get());
  std::vector<char> buffer(n * size);
  if (n > 0) h5::check_status(H5Dread(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer.data()), what);
  std::vector<std::string> out;
  for (hsize_t i = 0; i < n; ++i) {
    const char* s = buffer.data() + i * size;
    out.emplace_back(s, std::find(s, s + size, '\0'));
  }
  return out;
}

void write_root_attrs(hid_t file, const char* schema, const std::map<std::string, AttrValue>& attrs) {
  const h5::Object root(H5Oopen(file, "/", H5P_DEFAULT), "open '/'");
  h5::write_attr(root.get(), "schema", std::string(schema));
  h5::write_attr(root.get(), "version", std::string(kVersion));
  h5::write_attr(root.get(), "git_commit", std::string(kGitCommit));
  h5::write_attr(root.get(), "utc_time", h5::utc_now_iso8601());
  for (const auto& [name, value] : attrs) h5::write_attr(root.get(), name, value);
}

std::map<std::string, AttrValue> read_root_attrs(hid_t file) {
  const h5::Object root(H5Oopen(file, "/", H5P_DEFAULT), "open '/'");
  std::map<std::string, AttrValue> out;
  for (const auto& name : h5::attr_names(root.get())) out.emplace(name, h5::read_attr(root.get(), name));
  return out;
}

h5::File open_read(const std::string& path) {
  const h5::PropertyList fapl = h5::file_access_properties();
  return h5::File(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), fmt::format("open checkpoint file '{}'", path));
}

void check_schema(const std::map<std::string, AttrValue>& attrs, const char* schema, const std::string& path) {
  const auto it = attrs.find("schema");
  const std::string found = it != attrs.end() && std::holds_alternative<std::string>(it->second)
                                ? std::get<std::string>(it->second)
                                : std::string("(none)");
  if (found != schema)
    throw Error(fmt::format("checkpoint file '{}' has schema '{}', expected '{}'", path, found, schema));
}

}  // namespace

// ---- rank files -------------------------------------------------------------------------------

struct ShardWriter::Impl {
  std::string path, tmp;
  std::vector<std::string> created_dirs;
  h5::File file;
  h5::Dataset data[3];
  std::int64_t total = 0;
};

ShardWriter::ShardWriter(const std::string& path, std::int64_t total) : impl_(std::make_unique<Impl>()) {
  const h5::QuietErrors quiet;
  auto& I = *impl_;
  I.path = path;
  I.tmp = h5::temporary_path(path);
  I.total = total;
  I.file = h5::create_file(I.tmp, false, &I.created_dirs);
  const hsize_t n = static_cast<hsize_t>(total), unlimited = H5S_UNLIMITED, chunk = std::max<hsize_t>(1, std::min(n, kChunk));
  for (StateKind k : kKinds) {
    const std::string what = fmt::format("checkpoint file '{}': create '{}'", path, state_kind_name(k));
    const h5::Dataspace space(H5Screate_simple(1, &n, &unlimited), what);
    const h5::PropertyList dcpl(H5Pcreate(H5P_DATASET_CREATE), what);
    h5::check_status(H5Pset_chunk(dcpl.get(), 1, &chunk), what);
    h5::check_status(H5Pset_fletcher32(dcpl.get()), what);
    I.data[static_cast<int>(k)] = h5::Dataset(
        H5Dcreate2(I.file.get(), state_kind_name(k), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
        what);
  }
}

ShardWriter::~ShardWriter() {
  if (impl_ && impl_->file.is_open()) {   // not committed: a half-written file is of no use
    for (auto& d : impl_->data) d.reset();
    impl_->file.reset();
    h5::remove_abandoned(impl_->tmp, impl_->created_dirs);
  }
}

void ShardWriter::write(StateKind kind, std::int64_t offset, const float* data, std::int64_t count) {
  const h5::QuietErrors quiet;
  auto& I = *impl_;
  const std::string what = fmt::format("checkpoint file '{}': write '{}' [{}, {})", I.path, state_kind_name(kind),
                                       offset, offset + count);
  if (offset < 0 || count < 0 || offset + count > I.total) throw Error(fmt::format("{}: outside [0, {})", what, I.total));
  if (count == 0) return;
  const hid_t d = I.data[static_cast<int>(kind)].get();
  const h5::Dataspace file_space(H5Dget_space(d), what);
  const hsize_t start = static_cast<hsize_t>(offset), n = static_cast<hsize_t>(count);
  h5::check_status(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr), what);
  const h5::Dataspace mem(H5Screate_simple(1, &n, nullptr), what);
  h5::check_status(H5Dwrite(d, H5T_NATIVE_FLOAT, mem.get(), file_space.get(), H5P_DEFAULT, data), what);
}

void ShardWriter::write_state(const std::string& name, const std::vector<std::int64_t>& shape, const float* data) {
  const h5::QuietErrors quiet;
  auto& I = *impl_;
  if (name.empty() || name.find('/') != std::string::npos)
    throw Error(fmt::format("checkpoint file '{}': invalid state name '{}'", I.path, name));
  h5::write_f32(I.file.get(), "state/" + name, shape, data,
                fmt::format("checkpoint file '{}': write 'state/{}'", I.path, name));
}

void ShardWriter::commit(const std::vector<ShardPiece>& pieces, const std::map<std::string, AttrValue>& attrs) {
  const h5::QuietErrors quiet;
  auto& I = *impl_;
  const std::string what = fmt::format("checkpoint file '{}': piece table", I.path);
  std::vector<std::string> names;
  std::vector<std::int64_t> begin, end, offset;
  for (const auto& p : pieces) {
    names.push_back(p.name);
    begin.push_back(p.begin);
    end.push_back(p.end);
    offset.push_back(p.offset);
  }
  write_strings(I.file.get(), "pieces/name", names, what);
  write_i64(I.file.get(), "pieces/begin", begin, what);
  write_i64(I.file.get(), "pieces/end", end, what);
  write_i64(I.file.get(), "pieces/offset", offset, what);
  write_root_attrs(I.file.get(), kShardSchema, attrs);
  for (auto& d : I.data) d.reset();
  I.file.close(fmt::format("close '{}'", I.tmp));
  h5::commit_file(I.tmp, I.path);
}

struct ShardReader::Impl {
  h5::File file;
  std::map<std::string, AttrValue> attrs;
};

ShardReader::ShardReader(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  const h5::QuietErrors quiet;
  impl_->file = open_read(path);
  impl_->attrs = read_root_attrs(impl_->file.get());
  check_schema(impl_->attrs, kShardSchema, path);
}

const std::map<std::string, AttrValue>& ShardReader::attrs() const { return impl_->attrs; }

ShardReader::~ShardReader() = default;
ShardReader::ShardReader(ShardReader&&) noexcept = default;

std::vector<ShardPiece> ShardReader::pieces() const {
  const h5::QuietErrors quiet;
  const hid_t f = impl_->file.get();
  const auto names = read_strings(f, "pieces/name", path_);
  const auto begin = read_i64(f, "pieces/begin", path_), end = read_i64(f, "pieces/end", path_),
             offset = read_i64(f, "pieces/offset", path_);
  if (begin.size() != names.size() || end.size() != names.size() || offset.size() != names.size())
    throw Error(fmt::format("checkpoint file '{}': the piece table's columns differ in length", path_));
  std::vector<ShardPiece> out;
  for (std::size_t i = 0; i < names.size(); ++i) out.push_back({names[i], begin[i], end[i], offset[i]});
  return out;
}

void ShardReader::read(StateKind kind, std::int64_t offset, float* out, std::int64_t count) const {
  const h5::QuietErrors quiet;
  const std::string what =
      fmt::format("checkpoint file '{}': read '{}' [{}, {})", path_, state_kind_name(kind), offset, offset + count);
  if (count <= 0) return;
  const h5::Dataset d(H5Dopen2(impl_->file.get(), state_kind_name(kind), H5P_DEFAULT), what);
  if (offset < 0 || static_cast<hsize_t>(offset + count) > length(d.get(), what))
    throw Error(fmt::format("{}: outside the dataset", what));
  const h5::Dataspace file_space(H5Dget_space(d.get()), what);
  const hsize_t start = static_cast<hsize_t>(offset), n = static_cast<hsize_t>(count);
  h5::check_status(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr), what);
  const h5::Dataspace mem(H5Screate_simple(1, &n, nullptr), what);
  h5::check_status(H5Dread(d.get(), H5T_NATIVE_FLOAT, mem.get(), file_space.get(), H5P_DEFAULT, out), what);
}

std::optional<std::vector<std::int64_t>> ShardReader::state_shape(const std::string& name) const {
  const h5::QuietErrors quiet;
  const std::string at = "state/" + name;
  if (name.empty() || name.find('/') != std::string::npos || !h5::is_dataset(impl_->file.get(), at)) return std::nullopt;
  return h5::dataset_shape(impl_->file.get(), at, fmt::format("checkpoint file '{}': shape of '{}'", path_, at));
}

void ShardReader::read_state(const std::string& name, const std::vector<std::int64_t>& expected_shape,
                             float* out) const {
  const h5::QuietErrors quiet;
  if (name.empty() || name.find('/') != std::string::npos)
    throw Error(fmt::format("checkpoint file '{}': invalid state name '{}'", path_, name));
  const std::string at = "state/" + name;
  h5::read_f32(impl_->file.get(), at, expected_shape, out, fmt::format("checkpoint file '{}': read '{}'", path_, at));
}

// ---- index ------------------------------------------------------------------------------------

namespace {

// Sorts entries by (param, begin) and checks that each parameter is covered exactly once.
void check_coverage(std::vector<CheckpointIndex::Entry>& entries, const std::vector<std::string>& params,
                    const std::vector<std::int64_t>& numels, const std::string& where) {
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.param != b.param ? a.param < b.param : a.begin < b.begin; });
  std::size_t e = 0;
  for (std::size_t p = 0; p < params.size(); ++p) {
    std::int64_t next = 0;
    for (; e < entries.size() && entries[e].param == static_cast<int>(p); ++e) {
      if (entries[e].begin != next || entries[e].end <= entries[e].begin)
        throw Error(fmt::format("{}: parameter '{}' element {} is {} (pieces must cover it exactly once)", where,
                                params[p], std::min(next, entries[e].begin),
                                entries[e].begin < next ? "held twice" : "missing"));
      next = entries[e].end;
    }
    if (next != numels[p])
      throw Error(fmt::format("{}: parameter '{}' covered up to element {} of {}", where, params[p], next, numels[p]));
  }
}

}  // namespace

void write_index(const std::string& step_dir, int files,
                 const std::vector<std::pair<std::string, std::int64_t>>& params,
                 const std::map<std::string, AttrValue>& attrs) {
  const h5::QuietErrors quiet;
  const std::string path = (fs::path(step_dir) / kIndexFile).string();
  std::vector<std::string> names, file_names;
  std::vector<std::int64_t> numels;
  std::map<std::string, int> by_name;
  for (const auto& [name, numel] : params) {
    by_name.emplace(name, static_cast<int>(names.size()));
    names.push_back(name);
    numels.push_back(numel);
  }
  std::vector<CheckpointIndex::Entry> entries;
  for (int r = 0; r < files; ++r) {
    file_names.push_back(shard_file_name(r));
    const ShardReader reader((fs::path(step_dir) / file_names.back()).string());
    for (const auto& p : reader.pieces()) {
      const auto it = by_name.find(p.name);
      if (it == by_name.end())
        throw Error(fmt::format("checkpoint file '{}' holds '{}', which is not a parameter", reader.path(), p.name));
      entries.push_back({r, it->second, p.begin, p.end, p.offset});
    }
  }
  check_coverage(entries, names, numels, fmt::format("checkpoint '{}'", step_dir));
  const std::string tmp = h5::temporary_path(path);
  h5::File file = h5::create_file(tmp, false);
  const std::string what = fmt::format("checkpoint index '{}'", path);
  write_strings(file.get(), "params/name", names, what);
  write_i64(file.get(), "params/numel", numels, what);
  write_strings(file.get(), "files", file_names, what);
  std::vector<std::int64_t> col[5];
  for (const auto& e : entries) {
    col[0].push_back(e.file);
    col[1].push_back(e.param);
    col[2].push_back(e.begin);
    col[3].push_back(e.end);
    col[4].push_back(e.offset);
  }
  const char* cols[] = {"pieces/file", "pieces/param", "pieces/begin", "pieces/end", "pieces/offset"};
  for (int c = 0; c < 5; ++c) write_i64(file.get(), cols[c], col[c], what);
  write_root_attrs(file.get(), kIndexSchema, attrs);
  file.close(fmt::format("close '{}'", tmp));
  h5::commit_file(tmp, path);   // the checkpoint is complete from this rename on
}

CheckpointIndex read_index(const std::string& step_dir) {
  const h5::QuietErrors quiet;
  const std::string path = (fs::path(step_dir) / kIndexFile).string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw Error(fmt::format("checkpoint '{}' is incomplete: '{}' is missing", step_dir, path));
  CheckpointIndex ix;
  ix.dir = step_dir;
  const h5::File file = open_read(path);
  ix.attrs = read_root_attrs(file.get());
  check_schema(ix.attrs, kIndexSchema, path);
  ix.params = read_strings(file.get(), "params/name", path);
  ix.numels = read_i64(file.get(), "params/numel", path);
  ix.files = read_strings(file.get(), "files", path);
  const char* cols[] = {"pieces/file", "pieces/param", "pieces/begin", "pieces/end", "pieces/offset"};
  std::vector<std::int64_t> col[5];
  for (int c = 0; c < 5; ++c) col[c] = read_i64(file.get(), cols[c], path);
  if (ix.numels.size() != ix.params.size()) throw Error(fmt::format("checkpoint index '{}': params columns differ", path));
  for (int c = 1; c < 5; ++c)
    if (col[c].size() != col[0].size()) throw Error(fmt::format("checkpoint index '{}': pieces columns differ", path));
  for (std::size_t i = 0; i < col[0].size(); ++i) {
    if (col[0][i] < 0 || col[0][i] >= static_cast<std::int64_t>(ix.files.size()) || col[1][i] < 0 ||
        col[1][i] >= static_cast<std::int64_t>(ix.params.size()))
      throw Error(fmt::format("checkpoint index '{}': piece {} names a file or parameter that does not exist", path, i));
    ix.entries.push_back({static_cast<int>(col[0][i]), static_cast<int>(col[1][i]), col[2][i], col[3][i], col[4][i]});
  }
  check_coverage(ix.entries, ix.params, ix.numels, fmt::format("checkpoint index '{}'", path));
  return ix;
}

std::int64_t CheckpointIndex::int_attr(const std::string& name) const {
  const auto it = attrs.find(name);
  if (it == attrs.end() || !std::holds_alternative<std::int64_t>(it->second))
    throw Error(fmt::format("checkpoint index '{}/{}' lacks the integer attribute '{}'", dir, kIndexFile, name));
  return std::get<std::int64_t>(it->second);
}

double CheckpointIndex::double_attr(const std::string& name) const {
  const auto it = attrs.find(name);
  if (it == attrs.end() || !std::holds_alternative<double>(it->second))
    throw Error(fmt::format("checkpoint index '{}/{}' lacks the number attribute '{}'", dir, kIndexFile, name));
  return std::get<double>(it->second);
}

int CheckpointIndex::param_index(const std::string& name) const {
  const auto it = std::find(params.begin(), params.end(), name);
  return it == params.end() ? -1 : static_cast<int>(it - params.begin());
}

std::optional<std::string> model_mismatch(const CheckpointIndex& index,
                                          const std::map<std::string, std::int64_t>& dims) {
  for (const auto& [key, value] : dims) {
    const std::int64_t saved = index.int_attr(key);
    if (saved != value)
      return fmt::format("the checkpoint has model.{} = {} but the deck has {}", key, saved, value);
  }
  return std::nullopt;
}

// ---- the checkpoint directory -----------------------------------------------------------------

namespace {

// (step, path) of every step_NNNNNNNN directory under dir, complete or not, by ascending step.
std::vector<std::pair<std::int64_t, std::string>> step_dirs(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  static const std::regex pattern("step_([0-9]{8,})");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory(ec) || !std::regex_match(name, m, pattern)) continue;
    // A name whose number does not fit a step (step_99999999999999999999999) is not one of ours:
    // ignored with a warning (once per name), never "error: stoll" (issue 36).
    const std::string digits = m[1].str();
    std::int64_t step = 0;
    const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (err != std::errc() || end != digits.data() + digits.size()) {
      static std::set<std::string> warned;
      if (warned.insert(entry.path().string()).second)
        fmt::print(stderr, "lmscale: warning: ignoring '{}' in the checkpoint directory: its step number does not fit "
                           "a 64-bit step\n", entry.path().string());
      continue;
    }
    out.emplace_back(step, entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<std::pair<std::int64_t, std::string>> complete_checkpoints(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  std::error_code ec;
  for (auto& [step, path] : step_dirs(dir))
    if (fs::is_regular_file(fs::path(path) / kIndexFile, ec)) out.emplace_back(step, path);
  return out;
}

MovedAside move_aside_newer_checkpoints(const std::string& dir, std::int64_t step) {
  MovedAside moved;
  std::vector<std::string> newer;
  for (const auto& [s, path] : step_dirs(dir))
    if (s > step) newer.push_back(path);
  if (newer.empty()) return moved;
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32] = {};
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  // A folder of its own, even when two runs move checkpoints aside within one second.
  std::error_code ec;
  for (int n = 1;; ++n) {
    const fs::path folder = fs::path(dir) / (n == 1 ? fmt::format("superseded-{}", stamp)
                                                    : fmt::format("superseded-{}-{}", stamp, n));
    if (fs::create_directory(folder, ec)) {
      moved.folder = folder.string();
      break;
    }
    if (ec || n > 100)
      throw Error(fmt::format("cannot create '{}' to move the newer checkpoints aside: {}", folder.string(),
                              ec ? ec.message() : std::string("it exists")));
  }
  for (const auto& path : newer) {
    const fs::path name = fs::path(path).filename();
    fs::rename(path, fs::path(moved.folder) / name, ec);
    if (ec)
      throw Error(fmt::format("cannot move checkpoint '{}' aside into '{}': {}", path, moved.folder, ec.message()));
    moved.names.push_back(name.string());
  }
  return moved;
}

void prune_checkpoints(const std::string& dir, std::int64_t keep) {
  if (keep <= 0) return;
  const auto complete = complete_checkpoints(dir);
  if (static_cast<std::int64_t>(complete.size()) <= keep) return;
  const std::int64_t oldest_kept = complete[complete.size() - static_cast<std::size_t>(keep)].first;
  for (const auto& [step, path] : step_dirs(dir)) {
    if (step >= oldest_kept) continue;
    // The index goes first, so a directory half-removed by a crash reads as incomplete.
    std::error_code ec;
    fs::remove(fs::path(path) / kIndexFile, ec);
    fs::remove_all(path, ec);
  }
}

}  // namespace lmscale::io
