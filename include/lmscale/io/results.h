#pragma once
// HDF5 results files (schema lmscale-results/1, DESIGN.md §7, docs/hdf5.md). Only rank 0 writes:
// on other ranks a ResultsFile is inactive and every call is a no-op, so jobs gather data over MPI
// first and then call the same code on every rank. The file is written as NAME.tmp and renamed to
// NAME by finish(); a crashed run leaves NAME.tmp with every row flushed so far.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "lmscale/io/config.h"

namespace lmscale::io {

// One column of a table: a field of the compound type, with its unit ("" for none).
struct Column {
  enum class Type { i64, f64, str };   // str: fixed-length, 64 bytes, NUL-padded
  std::string name;
  Type type;
  std::string unit;
};
using Cell = std::variant<std::int64_t, double, std::string>;
using Row = std::vector<Cell>;

class ResultsFile;

// A 1-D extendible, chunked compound dataset; each row appended is written (and flushed on
// flush()). Attribute `units`: fixed-length string array, one unit per column in field order.
class Table {
 public:
  Table() = default;
  ~Table();
  Table(Table&&) noexcept;
  Table& operator=(Table&&) noexcept;
  void append(const Row& row);
  void flush();
  std::int64_t rows() const;
  bool active() const { return impl_ != nullptr; }

 private:
  friend class ResultsFile;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

using AttrValue = std::variant<std::int64_t, double, std::string, std::vector<double>, std::vector<std::int64_t>>;

class ResultsFile {
 public:
  // active=false (ranks other than 0): nothing is opened or written.
  ResultsFile(const std::string& path, bool active);
  ~ResultsFile();   // if finish() was not called, closes NAME.tmp and leaves it
  ResultsFile(const ResultsFile&) = delete;
  ResultsFile& operator=(const ResultsFile&) = delete;

  bool active() const;
  const std::string& path() const { return path_; }
  // Root attributes: schema, version, git commit, UTC time, command line, deck, resolved config,
  // world size.
  void write_provenance(const Config& cfg, int world_size);
  // Attribute on a group or dataset path ("/" for the root), creating groups as needed.
  void set_attr(const std::string& object_path, const std::string& name, const AttrValue& value);
  // New table at `path` (e.g. "/train/steps"); parent groups created as needed.
  Table create_table(const std::string& path, const std::vector<Column>& columns);
  // A plain n-D dataset of doubles/floats (e.g. checkpoints, timelines); parent groups created.
  void write_array(const std::string& path, const std::vector<std::int64_t>& shape, const float* data);
  void write_array(const std::string& path, const std::vector<std::int64_t>& shape, const double* data);
  void flush();
  // Closes and renames NAME.tmp -> NAME.
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace lmscale::io
