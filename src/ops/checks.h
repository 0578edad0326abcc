#pragma once
// Argument checks shared by the public ops:: functions (src/ops/*.cpp) before they dispatch to
// ops::cpu or ops::cuda. Every failure throws lmscale::Error naming the op and the argument, so a
// wrong call says which tensor was wrong and what was expected.
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "lmscale/core/error.h"
#include "lmscale/core/tensor.h"

namespace lmscale::ops::detail {

// A tensor argument with the name the error messages use.
using NamedTensor = std::pair<const char*, const Tensor*>;

// All the given tensors (null entries are skipped: optional outputs) are defined and live on one
// device, which is returned. At least one tensor must be non-null.
inline Device common_device(const char* op, std::initializer_list<NamedTensor> tensors) {
  const NamedTensor* first = nullptr;
  for (const auto& nt : tensors) {
    if (!nt.second) continue;
    LMSCALE_CHECK(nt.second->defined(), "{}: tensor '{}' has no data", op, nt.first);
    if (!first) {
      first = &nt;
      continue;
    }
    LMSCALE_CHECK(nt.second->device() == first->second->device(), "{}: '{}' is on {} but '{}' is on {}", op,
                  nt.first, device_name(nt.second->device()), first->first, device_name(first->second->device()));
  }
  LMSCALE_CHECK(first != nullptr, "{}: no tensor given", op);
  return first->second->device();
}

inline void check_shape(const char* op, const char* name, const Tensor& t, const Shape& expected) {
  LMSCALE_CHECK(t.shape() == expected, "{}: '{}' has shape {}, expected {}", op, name, shape_str(t.shape()),
                shape_str(expected));
}

inline void check_numel(const char* op, const char* name, const Tensor& t, std::int64_t expected) {
  LMSCALE_CHECK(t.numel() == expected, "{}: '{}' {} has {} elements, expected {}", op, name, shape_str(t.shape()),
                t.numel(), expected);
}

inline void check_dtype(const char* op, const char* name, const Tensor& t, DType expected) {
  LMSCALE_CHECK(t.dtype() == expected, "{}: '{}' is {}, expected {}", op, name, dtype_name(t.dtype()),
                dtype_name(expected));
}

inline void check_floating(const char* op, const char* name, const Tensor& t) {
  LMSCALE_CHECK(is_floating(t.dtype()), "{}: '{}' is {}, expected a floating dtype (fp32, fp64, bf16, fp16)", op,
                name, dtype_name(t.dtype()));
}

inline void check_same_dtype(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                             const Tensor& b) {
  LMSCALE_CHECK(a.dtype() == b.dtype(), "{}: '{}' is {} but '{}' is {}", op, name_a, dtype_name(a.dtype()), name_b,
                dtype_name(b.dtype()));
}

// An optional producer amax (ops.h): one fp32 element when given.
inline void check_amax_out(const char* op, const char* name, const Tensor* t) {
  LMSCALE_CHECK(!t || (t->dtype() == DType::f32 && t->numel() == 1), "{}: '{}' must be one fp32 element, is {} {}",
                op, name, t ? dtype_name(t->dtype()) : "", t ? shape_str(t->shape()) : "");
}

// The dtype of fp32-or-better statistics (rstd, loss, lse) kept for a tensor of dtype t.
inline DType stats_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// Tensors viewed as rows of their last dimension: [..., cols] -> rows = numel / cols.
inline std::int64_t rows_of(const char* op, const char* name, const Tensor& t) {
  LMSCALE_CHECK(t.ndim() >= 1, "{}: '{}' must have at least one dimension", op, name);
  const std::int64_t cols = t.dim(-1);
  return cols == 0 ? 0 : t.numel() / cols;
}

// Thrown where tensors live on CUDA in a build without CUDA.
[[noreturn]] inline void no_cuda_build(const char* op) {
  throw Error(fmt::format("{}: tensors are on cuda but this lmscale was built without CUDA", op));
}

// [rows, cols] blocks: `strided` tensors hold them rows `ld` elements apart (the model's a|b
// [N, 2F] column blocks), `dense` tensors contiguously; all of the first one's floating dtype.
inline void check_row_blocks(const char* op, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                             std::initializer_list<NamedTensor> strided, std::initializer_list<NamedTensor> dense) {
  LMSCALE_CHECK(rows >= 0 && cols >= 0 && ld >= cols, "{}: bad block rows {} cols {} ld {}", op, rows, cols, ld);
  const std::int64_t extent = rows == 0 ? 0 : (rows - 1) * ld + cols;
  const Tensor& a = *strided.begin()->second;
  check_floating(op, "a", a);
  for (const auto& [name, t] : strided) {
    LMSCALE_CHECK(t->numel() >= extent, "{}: '{}' has {} elements; {} rows of {} with row stride {} need {}", op, name,
                  t->numel(), rows, cols, ld, extent);
    check_same_dtype(op, "a", a, name, *t);
  }
  for (const auto& [name, t] : dense) {
    check_numel(op, name, *t, rows * cols);
    check_same_dtype(op, "a", a, name, *t);
  }
}

}  // namespace lmscale::ops::detail
