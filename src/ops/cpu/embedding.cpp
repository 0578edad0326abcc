// Token embedding on the CPU: a row gather, and its backward, a scatter-add done in row order so
// the result does not depend on anything but the inputs (repeated ids add up deterministically).
#include <cstring>

#include "cpu_ops.h"
#include "dtype_dispatch.h"

namespace lmscale::ops::cpu {
namespace {

// Every id in [0, V), else an error naming the first bad one.
void check_ids(const char* op, const std::int32_t* ids, std::int64_t n, std::int64_t V) {
  for (std::int64_t i = 0; i < n; ++i) {
    LMSCALE_CHECK(ids[i] >= 0 && ids[i] < V, "{}: ids[{}] = {} is outside the vocabulary [0, {})", op, i, ids[i], V);
  }
}

}  // namespace

void embedding(Context&, const Tensor& ids, const Tensor& table, Tensor& out) {
  constexpr const char* op = "ops::embedding";
  LMSCALE_CHECK(out.dtype() == table.dtype(), "{}: out and table must share a dtype", op);
  const std::int64_t n = ids.numel(), V = table.dim(0), d = table.dim(1);
  const std::int32_t* id = ids.data_as<std::int32_t>();
  check_ids(op, id, n, V);
  // A gather of bytes: any dtype works the same way.
  const std::size_t row_bytes = static_cast<std::size_t>(d) * dtype_size(table.dtype());
  const char* src = static_cast<const char*>(table.data());
  char* dst = static_cast<char*>(out.data());
  for (std::int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + static_cast<std::size_t>(i) * row_bytes, src + static_cast<std::size_t>(id[i]) * row_bytes,
                row_bytes);
  }
}

void embedding_backward(Context&, const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  constexpr const char* op = "ops::embedding_backward";
  LMSCALE_CHECK(dout.dtype() == dtable.dtype(), "{}: on CPU dout ({}) and dtable ({}) must share a dtype", op,
                dtype_name(dout.dtype()), dtype_name(dtable.dtype()));
  const std::int64_t n = ids.numel(), V = dtable.dim(0), d = dtable.dim(1);
  const std::int32_t* id = ids.data_as<std::int32_t>();
  check_ids(op, id, n, V);
  dispatch_real(op, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = dout.data_as<T>();
    T* table = dtable.data_as<T>();
    for (std::int64_t i = 0; i < n; ++i) {
      T* row = table + id[i] * d;
      const T* gi = g + i * d;
      for (std::int64_t j = 0; j < d; ++j) row[j] += gi[j];
    }
  });
}

}  // namespace lmscale::ops::cpu
