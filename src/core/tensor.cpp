#include "lmscale/core/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lmscale/core/error.h"

namespace lmscale {

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

Storage::Storage(Allocator& alloc, std::size_t bytes, const char* tag)
    : alloc_(&alloc), ptr_(alloc.allocate(bytes, tag)), bytes_(bytes), tag_(tag) {}

Storage::~Storage() { alloc_->deallocate(ptr_, bytes_, tag_); }

Tensor Tensor::empty(const Shape& shape, DType dtype, Allocator& alloc, const char* tag) {
  for (auto d : shape) LMSCALE_CHECK(d >= 0, "negative dimension in {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = alloc.device();
  t.storage_ = std::make_shared<Storage>(alloc, t.nbytes(), tag);
  t.data_ = t.storage_->data();
  return t;
}

Tensor Tensor::view(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.data_ = data;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  LMSCALE_CHECK(shape_numel(shape) == numel(), "reshape {} -> {}", shape_str(shape_), shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  LMSCALE_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "slice [{}, {}) of {}", begin, end,
                shape_str(shape_));
  Tensor t = *this;
  const std::int64_t row = shape_[0] ? numel() / shape_[0] : 0;
  t.data_ = static_cast<char*>(data_) + static_cast<std::size_t>(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::flat_range(std::int64_t offset, std::int64_t count) const {
  LMSCALE_CHECK(offset >= 0 && count >= 0 && offset + count <= numel(), "flat_range {}+{} of {}", offset, count,
                numel());
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + static_cast<std::size_t>(offset) * dtype_size(dtype_);
  t.shape_ = {count};
  return t;
}

}  // namespace lmscale
