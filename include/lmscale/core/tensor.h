#pragma once
// Tensor: a contiguous, row-major view of typed elements on one device. Owning tensors hold their
// bytes through a shared Storage (freed to the allocator that made them when the last view goes);
// non-owning views wrap memory owned elsewhere (e.g. a named parameter inside the flat buffer).
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "lmscale/core/allocator.h"
#include "lmscale/core/dtype.h"

namespace lmscale {

using Shape = std::vector<std::int64_t>;
std::int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);   // "[4, 16, 32]"

class Storage {
 public:
  Storage(Allocator& alloc, std::size_t bytes, const char* tag);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  Allocator* alloc_;
  void* ptr_;
  std::size_t bytes_;
  const char* tag_;
};

class Tensor {
 public:
  Tensor() = default;
  // New uninitialised tensor from `alloc` (device = alloc.device()).
  static Tensor empty(const Shape& shape, DType dtype, Allocator& alloc, const char* tag = "tensor");
  // Non-owning view of memory owned elsewhere.
  static Tensor view(void* data, const Shape& shape, DType dtype, Device device);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  // Whether both are views of one allocation (Tensor::view's tensors own none: never).
  bool same_storage(const Tensor& other) const { return storage_ != nullptr && storage_ == other.storage_; }
  void* data() const { return data_; }
  template <class T>
  T* data_as() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int i) const { return shape_[static_cast<std::size_t>(i < 0 ? i + ndim() : i)]; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }

  // Same bytes, new shape with the same number of elements.
  Tensor reshape(const Shape& shape) const;
  // Rows [begin, end) of the leading dimension, sharing the bytes.
  Tensor slice(std::int64_t begin, std::int64_t end) const;
  // Elements [offset, offset+count) of the flattened tensor as a 1-D view.
  Tensor flat_range(std::int64_t offset, std::int64_t count) const;

 private:
  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

}  // namespace lmscale
