#pragma once
// HDF5 results files (schema lmscale-results/2, docs/architecture.md §7, docs/hdf5.md). Only rank 0 writes:
// on other ranks a ResultsFile is inactive and every call is a no-op, so jobs gather data over MPI
// first and then call the same code on every rank. The file is written as NAME.tmp and renamed to
// NAME by finish(); a run that stops after measuring something leaves NAME.tmp with every row
// flushed so far, one that stops before leaves nothing (abandon()). What may be replaced is the
// overwrite rule of docs/hdf5.md. HDF5 here is the serial, not thread-safe library: call from one
// thread (the main thread).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "lmscale/io/attr_value.h"
#include "lmscale/io/config.h"

namespace lmscale::io {

// One column of a table: a field of the compound type, with its unit ("" for none).
struct Column {
  enum class Type { i64, f64, str };   // str: variable-length UTF-8
  std::string name;
  Type type;
  std::string unit;
};
using Cell = std::variant<std::int64_t, double, std::string>;
using Row = std::vector<Cell>;

class ResultsFile;

// A 1-D extendible, chunked compound dataset; each row appended is written (and flushed on
// flush()). Attribute `units`: variable-length string array, one unit per column in field order.
class Table {
 public:
  Table() = default;
  ~Table();
  Table(Table&&) noexcept;
  Table& operator=(Table&&) noexcept;
  // Cells must match the columns in order and type (an int64 is accepted for an f64 column);
  // strings are stored whole (UTF-8, no NUL byte). Throws Error naming the table and column.
  void append(const Row& row);
  void append_rows(const std::vector<Row>& rows);   // one extend + one write for all of them
  void flush();
  std::int64_t rows() const;   // rows written (0 when inactive)
  bool active() const { return impl_ != nullptr; }

 private:
  friend class ResultsFile;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Columns of /system/ranks (docs/hdf5.md): rank, host, local_rank, device, device_name, mpi,
// hdf5, nccl, cuda, blas; one row per MPI rank, written by the job/app from gathered data.
const std::vector<Column>& system_ranks_columns();
// Version of the HDF5 library linked in, e.g. "1.10.8" (for the hdf5 column).
std::string hdf5_version();

class ResultsFile {
 public:
  // active=false (ranks other than 0): nothing is opened or written.
  ResultsFile(const std::string& path, bool active);
  ~ResultsFile();   // if finish() was not called: abandon()
  ResultsFile(const ResultsFile&) = delete;
  ResultsFile& operator=(const ResultsFile&) = delete;

  bool active() const;
  const std::string& path() const { return path_; }
  // Root attributes (docs/hdf5.md): schema, version, git_commit, utc_time, command_line,
  // deck_path, deck, config (cfg.resolved, or to_ini(cfg) when empty), job, world_size.
  void write_provenance(const Config& cfg, int world_size);
  // Attribute on a group or dataset path ("/" for the root), creating groups as needed. A numeric
  // value's unit (io::attribute_unit) is recorded in the object's `attribute_units` (JSON text,
  // docs/hdf5.md); a numeric name without a known unit, and the names `units` and
  // `attribute_units`, throw Error.
  void set_attr(const std::string& object_path, const std::string& name, const AttrValue& value);
  // New table at `path` (e.g. "/train/steps"); parent groups created as needed.
  Table create_table(const std::string& path, const std::vector<Column>& columns);
  // A plain n-D dataset of float32/float64 (e.g. timelines), row-major; parent groups created;
  // shape {} is a scalar.
  void write_array(const std::string& path, const std::vector<std::int64_t>& shape, const float* data);
  void write_array(const std::string& path, const std::vector<std::int64_t>& shape, const double* data);
  void flush();
  // Closes and renames NAME.tmp -> NAME. Tables still open are closed with the file; any call
  // after finish() throws Error (on an active file).
  void finish();
  // A run that stops without finish(): when the file holds results (has_results()) NAME.tmp is
  // flushed, closed and kept, and its path returned so that the error message can name it;
  // otherwise NAME.tmp and the directories made for it are removed and "" is returned. Later
  // calls do nothing and return "".
  std::string abandon();
  // After abandon(): NAME.tmp was kept but could not be flushed or closed (a write failed: full
  // disk, quota). HDF5 may then refuse to open it ("truncated file"); `h5clear --increment NAME.tmp`
  // makes it readable again, with the rows of the last successful flush.
  bool damaged() const;
  // Whether a result was written: a row of a table outside /system, or an array. Provenance
  // (root attributes, /system/ranks) is not a result.
  bool has_results() const;
  std::int64_t result_rows() const;   // rows appended to tables outside /system

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace lmscale::io
