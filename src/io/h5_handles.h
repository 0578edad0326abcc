#pragma once
// RAII wrappers of HDF5 identifiers: one class per kind of hid_t, each closing itself with the
// matching H5?close. Move-only. A handle whose object was already closed by the library (files
// are opened with H5F_CLOSE_STRONG, which closes every object of the file) is skipped on close.
#include <hdf5.h>

#include <string>
#include <utility>

namespace lmscale::io::h5 {

// Returns `id` if valid; else throws lmscale::Error "HDF5: <what>: <HDF5's innermost message>".
hid_t check(hid_t id, const std::string& what);
// Throws likewise when `status` < 0.
void check_status(herr_t status, const std::string& what);

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
    if (id >= 0 && H5Iis_valid(id) > 0) check_status(Close(id), what);
  }
  void reset() noexcept {
    if (id_ >= 0 && H5Iis_valid(id_) > 0) Close(id_);
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
