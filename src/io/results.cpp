// HDF5 results files (schema lmscale-results/2, docs/hdf5.md): root provenance attributes,
// 1-D compound tables appended row by row (strings variable-length UTF-8), attributes with the
// units of the numeric ones, and arrays, written to NAME.tmp and renamed to NAME by finish().
#include "lmscale/io/results.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <type_traits>

#include <fmt/format.h>

#include "h5_support.h"
#include "json_text.h"
#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"
#include "lmscale/io/result_units.h"
#include "lmscale/version.h"

namespace lmscale::io {

namespace {

constexpr hsize_t kChunkRows = 256;
constexpr const char* kSchema = "lmscale-results/2";

std::size_t cell_bytes(Column::Type type) {
  switch (type) {
    case Column::Type::i64: return sizeof(std::int64_t);
    case Column::Type::f64: return sizeof(double);
    case Column::Type::str: return sizeof(const char*);   // variable-length: a pointer in memory
  }
  return 0;
}

const char* type_name(Column::Type type) {
  switch (type) {
    case Column::Type::i64: return "int64";
    case Column::Type::f64: return "float64";
    case Column::Type::str: return "string";
  }
  return "?";
}

const char* cell_type_name(const Cell& cell) {
  return std::holds_alternative<std::int64_t>(cell) ? "int64" : std::holds_alternative<double>(cell) ? "float64" : "string";
}

}  // namespace

const std::vector<Column>& system_ranks_columns() {
  using T = Column::Type;
  static const std::vector<Column> columns{
      {"rank", T::i64, ""},   {"host", T::str, ""}, {"local_rank", T::i64, ""}, {"device", T::str, ""},
      {"device_name", T::str, ""}, {"mpi", T::str, ""}, {"hdf5", T::str, ""},      {"nccl", T::str, ""},
      {"cuda", T::str, ""},   {"blas", T::str, ""}};
  return columns;
}

std::string hdf5_version() { return h5::library_version(); }

// ---- Table ----------------------------------------------------------------------------------

struct Table::Impl {
  std::string path;
  std::vector<Column> columns;
  std::vector<std::size_t> offsets;   // byte offset of each column in a packed row
  std::size_t row_bytes = 0;
  h5::Datatype type;                  // packed compound, used in memory and in the file
  h5::Dataset dataset;
  std::int64_t rows = 0;
  // The file's count of result rows (rows of tables outside /system); null for /system tables.
  std::shared_ptr<std::int64_t> result_rows;

  // Packs `row` into `out` (row_bytes bytes). String cells become pointers into `row`, which
  // must outlive the write.
  void pack(const Row& row, std::int64_t index, char* out) const {
    if (row.size() != columns.size())
      throw Error(fmt::format("table '{}': row {} has {} cells but the table has {} columns", path, index, row.size(),
                              columns.size()));
    for (std::size_t c = 0; c < columns.size(); ++c) {
      char* field = out + offsets[c];
      const Cell& cell = row[c];
      const Column& col = columns[c];
      const bool ok = std::visit(
          [&](const auto& v) {
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, std::string>) {
              if (col.type != Column::Type::str) return false;
              if (v.find('\0') != std::string::npos)
                throw Error(fmt::format("table '{}': column '{}' of row {} holds a NUL byte", path, col.name, index));
              const char* text = v.c_str();
              std::memcpy(field, &text, sizeof text);
            } else if constexpr (std::is_same_v<V, std::int64_t>) {
              if (col.type == Column::Type::i64) {
                std::memcpy(field, &v, sizeof v);
              } else if (col.type == Column::Type::f64) {
                const double d = static_cast<double>(v);
                std::memcpy(field, &d, sizeof d);
              } else {
                return false;
              }
            } else {
              if (col.type != Column::Type::f64) return false;
              std::memcpy(field, &v, sizeof v);
            }
            return true;
          },
          cell);
      if (!ok)
        throw Error(fmt::format("table '{}': column '{}' is {} but row {} gives a {}", path, col.name,
                                type_name(col.type), index, cell_type_name(cell)));
    }
  }
};

Table::~Table() = default;
Table::Table(Table&&) noexcept = default;
Table& Table::operator=(Table&&) noexcept = default;

void Table::append(const Row& row) { append_rows({row}); }

void Table::append_rows(const std::vector<Row>& rows) {
  if (!impl_ || rows.empty()) return;
  const h5::QuietErrors quiet;
  Impl& t = *impl_;
  if (!t.dataset.is_open()) throw Error(fmt::format("table '{}': append after the results file was finished", t.path));
  std::vector<char> buffer(rows.size() * t.row_bytes, '\0');
  for (std::size_t i = 0; i < rows.size(); ++i)
    t.pack(rows[i], t.rows + static_cast<std::int64_t>(i), buffer.data() + i * t.row_bytes);
  const std::string what = fmt::format("append to table '{}'", t.path);
  const hsize_t start = static_cast<hsize_t>(t.rows), count = rows.size(), new_size = start + count;
  h5::check_status(H5Dset_extent(t.dataset.get(), &new_size), what);
  const h5::Dataspace file_space(H5Dget_space(t.dataset.get()), what);
  h5::check_status(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr), what);
  const h5::Dataspace memory_space(H5Screate_simple(1, &count, nullptr), what);
  h5::check_status(H5Dwrite(t.dataset.get(), t.type.get(), memory_space.get(), file_space.get(), H5P_DEFAULT,
                            buffer.data()),
                   what);
  t.rows = static_cast<std::int64_t>(new_size);
  if (t.result_rows) *t.result_rows += static_cast<std::int64_t>(count);
}

void Table::flush() {
  if (!impl_) return;
  const h5::QuietErrors quiet;
  if (!impl_->dataset.is_open()) return;   // the file was finished: everything is on disk
  h5::check_status(H5Fflush(impl_->dataset.get(), H5F_SCOPE_LOCAL), fmt::format("flush table '{}'", impl_->path));
}

std::int64_t Table::rows() const { return impl_ ? impl_->rows : 0; }

// ---- ResultsFile ----------------------------------------------------------------------------

struct ResultsFile::Impl {
  std::string tmp_path;
  h5::File file;
  bool finished = false;
  std::vector<std::string> created_dirs;   // by create_file, innermost first
  // Rows appended to tables outside /system (provenance is not a result) and arrays written:
  // what a stopped run has to keep.
  std::shared_ptr<std::int64_t> result_rows = std::make_shared<std::int64_t>(0);
  std::int64_t result_arrays = 0;
  bool damaged = false;   // abandon() could not flush or close it
  // Object path -> {numeric attribute -> unit}: written as the object's `attribute_units`.
  std::map<std::string, std::map<std::string, std::string>> attribute_units;

  // The unit of the numeric attribute `name`; a name without a known unit is a programming error
  // (result_units.cpp lists them), reported before anything is written.
  static std::string unit_of(const std::string& object_path, const std::string& name) {
    const auto unit = attribute_unit(name);
    if (!unit)
      throw Error(fmt::format("results: attribute '{}' of '{}' has no unit; add it to src/io/result_units.cpp",
                              name, object_path));
    return *unit;
  }

  // Records `unit` for the numeric attribute `name` of `object` and rewrites the object's
  // `attribute_units` (a JSON object, docs/hdf5.md).
  void note_unit(hid_t object, const std::string& object_path, const std::string& name, const std::string& unit) {
    auto& units = attribute_units[object_path];
    units[name] = unit;
    std::string text = "{";
    for (const auto& [n, u] : units) text += (text.size() > 1 ? ", " : "") + json::quote(n) + ": " + json::quote(u);
    h5::write_attr(object, "attribute_units", text + "}");
  }

  hid_t open_file(const std::string& path, const char* operation) const {
    if (finished) throw Error(fmt::format("results file '{}': {} after finish()", path, operation));
    return file.get();
  }
};

ResultsFile::ResultsFile(const std::string& path, bool active) : path_(path) {
  if (!active) return;
  const h5::QuietErrors quiet;
  auto impl = std::make_unique<Impl>();
  impl->tmp_path = h5::temporary_path(path);
  impl->file = h5::create_file(impl->tmp_path, /*track_creation_order=*/false, &impl->created_dirs);
  impl_ = std::move(impl);
}

ResultsFile::~ResultsFile() {
  try {
    abandon();
  } catch (...) {   // a destructor must not throw; abandon() reports nothing it cannot do
  }
}

std::string ResultsFile::abandon() {
  if (!impl_ || impl_->finished) return "";
  const h5::QuietErrors quiet;
  impl_->finished = true;
  if (has_results()) {
    // Rows were measured: flush them and keep NAME.tmp, which the caller names. A flush or close
    // that fails (a full disk) may leave the file's end-of-file mark past what reached the disk.
    const bool flushed = H5Fflush(impl_->file.get(), H5F_SCOPE_LOCAL) >= 0;
    H5Eclear2(H5E_DEFAULT);
    const bool was_failed = h5::close_failed();
    impl_->file.reset();
    impl_->damaged = !flushed || (!was_failed && h5::close_failed());
    return impl_->tmp_path;
  }
  // Nothing measured yet: leave nothing behind (the file and the directories made for it).
  impl_->file.reset();
  h5::remove_abandoned(impl_->tmp_path, impl_->created_dirs);
  return "";
}

bool ResultsFile::damaged() const { return impl_ && impl_->damaged; }

bool ResultsFile::has_results() const {
  return impl_ && (*impl_->result_rows > 0 || impl_->result_arrays > 0);
}

std::int64_t ResultsFile::result_rows() const { return impl_ ? *impl_->result_rows : 0; }

bool ResultsFile::active() const { return impl_ != nullptr; }

void ResultsFile::write_provenance(const Config& cfg, int world_size) {
  if (!impl_) return;
  const h5::QuietErrors quiet;
  const hid_t file = impl_->open_file(path_, "write_provenance");
  const h5::Object root(H5Oopen(file, "/", H5P_DEFAULT), "open '/'");
  h5::write_attr(root.get(), "schema", std::string(kSchema));
  h5::write_attr(root.get(), "version", std::string(kVersion));
  h5::write_attr(root.get(), "git_commit", std::string(kGitCommit));
  h5::write_attr(root.get(), "utc_time", h5::utc_now_iso8601());
  h5::write_attr(root.get(), "command_line", cfg.command_line);
  h5::write_attr(root.get(), "deck_path", cfg.deck_path);
  h5::write_attr(root.get(), "deck", cfg.deck_text);
  h5::write_attr(root.get(), "config", cfg.resolved.empty() ? to_ini(cfg) : cfg.resolved);
  h5::write_attr(root.get(), "job", to_string(cfg.run.job));
  h5::write_attr(root.get(), "world_size", static_cast<std::int64_t>(world_size));
  impl_->note_unit(root.get(), "/", "world_size", Impl::unit_of("/", "world_size"));
}

void ResultsFile::set_attr(const std::string& object_path, const std::string& name, const AttrValue& value) {
  if (!impl_) return;
  const h5::QuietErrors quiet;
  const hid_t file = impl_->open_file(path_, "set_attr");
  if (name == "attribute_units" || name == "units")
    throw Error(fmt::format("results: attribute name '{}' of '{}' is reserved", name, object_path));
  const std::string where = object_path.empty() || object_path[0] != '/' ? "/" + object_path : object_path;
  const bool numeric = !std::holds_alternative<std::string>(value);
  const std::string unit = numeric ? Impl::unit_of(where, name) : "";
  const h5::Object object = h5::open_or_create_group(file, object_path);
  h5::write_attr(object.get(), name, value);
  if (numeric) impl_->note_unit(object.get(), where, name, unit);
}

Table ResultsFile::create_table(const std::string& path, const std::vector<Column>& columns) {
  Table table;
  if (!impl_) return table;
  const h5::QuietErrors quiet;
  const hid_t file = impl_->open_file(path_, "create_table");
  if (columns.empty()) throw Error(fmt::format("table '{}': no columns", path));
  std::set<std::string> names;
  for (const auto& c : columns)
    if (c.name.empty() || !names.insert(c.name).second)
      throw Error(fmt::format("table '{}': column names must be unique and non-empty ('{}')", path, c.name));
  if (h5::exists(file, path)) throw Error(fmt::format("table '{}' exists already in '{}'", path, path_));

  auto t = std::make_unique<Table::Impl>();
  t->path = path;
  t->columns = columns;
  if (path.rfind("/system/", 0) != 0 && path.rfind("system/", 0) != 0) t->result_rows = impl_->result_rows;
  for (const auto& c : columns) {
    t->offsets.push_back(t->row_bytes);
    t->row_bytes += cell_bytes(c.type);
  }
  const std::string what = fmt::format("create table '{}'", path);
  t->type = h5::Datatype(H5Tcreate(H5T_COMPOUND, t->row_bytes), what);
  const h5::Datatype string_type = h5::variable_string_type();
  for (std::size_t i = 0; i < columns.size(); ++i) {
    const hid_t member = columns[i].type == Column::Type::i64   ? H5T_STD_I64LE
                         : columns[i].type == Column::Type::f64 ? H5T_IEEE_F64LE
                                                                : string_type.get();
    h5::check_status(H5Tinsert(t->type.get(), columns[i].name.c_str(), t->offsets[i], member), what);
  }
  const hsize_t zero = 0, unlimited = H5S_UNLIMITED, chunk = kChunkRows;
  const h5::Dataspace space(H5Screate_simple(1, &zero, &unlimited), what);
  const h5::PropertyList dcpl(H5Pcreate(H5P_DATASET_CREATE), what);
  h5::check_status(H5Pset_chunk(dcpl.get(), 1, &chunk), what);
  const h5::PropertyList lcpl = h5::intermediate_groups();
  t->dataset = h5::Dataset(
      H5Dcreate2(file, path.c_str(), t->type.get(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT), what);
  std::vector<std::string> units;
  for (const auto& c : columns) units.push_back(c.unit);
  h5::write_string_array_attr(t->dataset.get(), "units", units);
  table.impl_ = std::move(t);
  return table;
}

namespace {

template <class T>
void write_plain_array(hid_t file, const std::string& path, const std::vector<std::int64_t>& shape, const T* data) {
  const std::string what = fmt::format("write array '{}'", path);
  std::vector<hsize_t> dims;
  hsize_t count = 1;
  for (auto d : shape) {
    if (d < 0) throw Error(fmt::format("array '{}': negative dimension {}", path, d));
    dims.push_back(static_cast<hsize_t>(d));
    count *= static_cast<hsize_t>(d);
  }
  if (count > 0 && data == nullptr) throw Error(fmt::format("array '{}': null data for {} elements", path, count));
  const h5::Dataspace space(dims.empty() ? H5Screate(H5S_SCALAR)
                                         : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                            what);
  const bool is_float = std::is_same_v<T, float>;
  const h5::PropertyList lcpl = h5::intermediate_groups();
  const h5::Dataset dataset(H5Dcreate2(file, path.c_str(), is_float ? H5T_IEEE_F32LE : H5T_IEEE_F64LE, space.get(),
                                       lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                            what);
  if (count > 0)
    h5::check_status(H5Dwrite(dataset.get(), is_float ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL,
                              H5P_DEFAULT, data),
                     what);
}

}  // namespace

void ResultsFile::write_array(const std::string& path, const std::vector<std::int64_t>& shape, const float* data) {
  if (!impl_) return;
  const h5::QuietErrors quiet;
  write_plain_array(impl_->open_file(path_, "write_array"), path, shape, data);
  ++impl_->result_arrays;
}

void ResultsFile::write_array(const std::string& path, const std::vector<std::int64_t>& shape, const double* data) {
  if (!impl_) return;
  const h5::QuietErrors quiet;
  write_plain_array(impl_->open_file(path_, "write_array"), path, shape, data);
  ++impl_->result_arrays;
}

void ResultsFile::flush() {
  if (!impl_ || impl_->finished) return;
  const h5::QuietErrors quiet;
  h5::check_status(H5Fflush(impl_->file.get(), H5F_SCOPE_LOCAL), fmt::format("flush '{}'", impl_->tmp_path));
}

void ResultsFile::finish() {
  if (!impl_ || impl_->finished) return;
  const h5::QuietErrors quiet;
  impl_->finished = true;
  impl_->file.close(fmt::format("close '{}'", impl_->tmp_path));
  h5::commit_file(impl_->tmp_path, path_);
}

}  // namespace lmscale::io
