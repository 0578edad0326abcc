#pragma once
// Small helpers over the HDF5 C API shared by results files (results.cpp) and checkpoints
// (checkpoint.cpp): string types, paths with intermediate groups, attributes, and the
// write-to-NAME.tmp-then-rename convention.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "h5_handles.h"
#include "lmscale/io/attr_value.h"

namespace lmscale::io::h5 {

// Fixed-length strings of `size` bytes, NUL-padded (no terminator needed), ASCII.
Datatype fixed_string_type(std::size_t size);
// Variable-length UTF-8 strings (h5py reads them as str).
Datatype variable_string_type();

// True when every component of `path` ("/a/b/c" or "a/b/c") exists below `loc`.
bool exists(hid_t loc, const std::string& path);
// True when `path` names a dataset (not a group) below `loc`.
bool is_dataset(hid_t loc, const std::string& path);
// Link-creation properties that create missing parent groups.
PropertyList intermediate_groups();
// The group or dataset at `path` ("/" = root), creating groups (and parents) when missing.
Object open_or_create_group(hid_t file, const std::string& path);

// Writes attribute `name` on object `obj`, replacing an existing one. Strings: variable-length
// UTF-8 scalars; vectors: 1-D arrays; int64: 64-bit little-endian; double: IEEE 64-bit.
void write_attr(hid_t obj, const std::string& name, const AttrValue& value);
// A 1-D array attribute of variable-length UTF-8 strings (e.g. `units`; h5py reads str).
void write_string_array_attr(hid_t obj, const std::string& name, const std::vector<std::string>& values);
// Reads an attribute written as above (also fixed-length strings and 32-bit numbers). Throws
// Error for kinds AttrValue cannot hold (compound, string arrays, >1-D).
AttrValue read_attr(hid_t obj, const std::string& name);
std::vector<std::string> attr_names(hid_t obj);

// A float32 dataset of `shape` ({} = scalar; row-major `data`, null only when empty) at `path`
// below `loc`, parent groups created. `what` prefixes errors.
void write_f32(hid_t loc, const std::string& path, const std::vector<std::int64_t>& shape, const float* data,
               const std::string& what);
// The shape of the dataset at `path` (Error prefixed with `what` when there is none).
std::vector<std::int64_t> dataset_shape(hid_t loc, const std::string& path, const std::string& what);
// Reads the float32 dataset at `path` into `out` when its shape is `expected_shape`; Error naming
// both shapes otherwise (`what` names the dataset).
void read_f32(hid_t loc, const std::string& path, const std::vector<std::int64_t>& expected_shape, float* out,
              const std::string& what);

// File access: H5F_CLOSE_STRONG (closing the file closes every object still open in it) and
// file locking that is skipped where the file system does not support it.
PropertyList file_access_properties();
// Creates an HDF5 file for writing (a NAME.tmp): missing parent directories are created (and
// listed in `created_dirs`, innermost first, when given); an existing regular file or link at
// `path` is removed first and the file is created exclusively, so nothing is written through a
// link or into a device; it is opened with H5F_CLOSE_STRONG so closing it closes every object
// still open in it.
File create_file(const std::string& path, bool track_creation_order, std::vector<std::string>* created_dirs = nullptr);
// Removes an abandoned NAME.tmp and then those of `created_dirs` (innermost first) that are empty.
void remove_abandoned(const std::string& path, const std::vector<std::string>& created_dirs);

std::string temporary_path(const std::string& path);   // PATH.tmp
// Renames PATH.tmp to PATH (replacing an existing PATH atomically on POSIX) when PATH may be
// replaced (output_target.h: absent, an empty or HDF5 regular file, or a link); otherwise throws
// Error and leaves both as they are.
void commit_file(const std::string& tmp, const std::string& path);
std::string utc_now_iso8601();                          // "2025-01-31T12:34:56Z"
std::string library_version();                          // "1.10.8"
// Whether an HDF5 close failed in this process (note_close_failure, h5_handles.h).
bool close_failed() noexcept;

}  // namespace lmscale::io::h5
