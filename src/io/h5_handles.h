#pragma once
// RAII wrappers of HDF5 identifiers: one class per kind of hid_t, each closing itself with the
// matching H5?close. Move-only. A handle whose object was already closed by the library (files
// are opened with H5F_CLOSE_STRONG, which closes every object of the file) is skipped on close.
// A close that fails (a write error while flushing: full disk, quota, file-size limit) is noted
// (note_close_failure), because HDF5 1.10 then frees the object but keeps its identifier, and
// closing it again when the library terminates crashes (io/hdf5_library.h).
#include <hdf5.h>

#include <string>
#include <utility>

namespace lmscale::io::h5 {

// Returns `id` if valid; else throws lmscale::Error "HDF5: <what>: <HDF5's innermost message>".
hid_t check(hid_t id, const std::string& what);
// Throws likewise when `status` < 0.
void check_status(herr_t status, const std::string& what);
// Records that an H5?close failed in this process (io/hdf5_library.h reads it).
void note_close_failure() noexcept;
// Runs close(id) with HDF5's automatic error printing off; a failure is noted and its error
// stack cleared (a destructor has nothing to report it to: the error that started the unwinding
// was reported already).
herr_t close_quietly(herr_t (*close)(hid_t), hid_t id) noexcept;

template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, const std::string& what) : id_(check(id, what)) {}
  ~Handle() { reset(); }
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  // False once closed, here or by the library.
  bool is_open() const { return id_ >= 0 && H5Iis_valid(id_) > 0; }
  // Closes now and reports failure (destructors cannot); used where a failed close loses data.
  void close(const std::string& what) {
    const hid_t id = std::exchange(id_, H5I_INVALID_HID);
    if (id >= 0 && H5Iis_valid(id) > 0) {
      const herr_t status = Close(id);
      if (status < 0) note_close_failure();
      check_status(status, what);
    }
  }
  void reset() noexcept {
    if (id_ >= 0 && H5Iis_valid(id_) > 0) close_quietly(Close, id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

using File = Handle<H5Fclose>;
using Group = Handle<H5Gclose>;
using Dataset = Handle<H5Dclose>;
using Dataspace = Handle<H5Sclose>;
using Datatype = Handle<H5Tclose>;
using Attribute = Handle<H5Aclose>;
using PropertyList = Handle<H5Pclose>;
using Object = Handle<H5Oclose>;   // a group or dataset opened by path (H5Oopen)

// Turns off HDF5's automatic printing of its error stack for the scope: failures become
// exceptions carrying HDF5's message instead (check()).
class QuietErrors {
 public:
  QuietErrors();
  ~QuietErrors();
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

}  // namespace lmscale::io::h5
