// Vocabulary-parallel embedding and cross-entropy on the CPU (include/lmscale/ops/vocab_parallel.h).
// Row statistics accumulate in double; the statistics tensors have the logits' dtype (fp32/fp64).
// The loss steps read a whole row before writing its gradient, so dlogits may alias logits.
#include <cmath>
#include <cstring>

#include "cpu_ops.h"
#include "dtype_dispatch.h"

namespace lmscale::ops::cpu {

void embedding_shard(Context&, const Tensor& ids, const Tensor& table, std::int64_t vocab_begin, Tensor& out) {
  const std::int64_t n = ids.numel(), Vl = table.dim(0), d = table.dim(1);
  const std::int32_t* id = ids.data_as<std::int32_t>();
  const std::size_t row_bytes = static_cast<std::size_t>(d) * dtype_size(table.dtype());
  const char* src = static_cast<const char*>(table.data());
  char* dst = static_cast<char*>(out.data());
  // All-zero bytes are +0 in every float dtype: a row outside this rank's range adds nothing.
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t local = id[i] - vocab_begin;
    char* row = dst + static_cast<std::size_t>(i) * row_bytes;
    if (local >= 0 && local < Vl) std::memcpy(row, src + static_cast<std::size_t>(local) * row_bytes, row_bytes);
    else std::memset(row, 0, row_bytes);
  }
}

void embedding_shard_backward(Context&, const Tensor& ids, const Tensor& dout, std::int64_t vocab_begin,
                              Tensor& dtable) {
  constexpr const char* op = "ops::embedding_shard_backward";
  LMSCALE_CHECK(dout.dtype() == dtable.dtype(), "{}: on CPU dout ({}) and dtable ({}) must share a dtype", op,
                dtype_name(dout.dtype()), dtype_name(dtable.dtype()));
  const std::int64_t n = ids.numel(), Vl = dtable.dim(0), d = dtable.dim(1);
  const std::int32_t* id = ids.data_as<std::int32_t>();
  dispatch_real(op, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = dout.data_as<T>();
    T* table = dtable.data_as<T>();
    for (std::int64_t i = 0; i < n; ++i) {   // row order: deterministic sums
      const std::int64_t local = id[i] - vocab_begin;
      if (local < 0 || local >= Vl) continue;
      T* row = table + local * d;
      const T* gi = g + i * d;
      for (std::int64_t j = 0; j < d; ++j) row[j] += gi[j];
    }
  });
}

void vocab_parallel_max(Context&, const Tensor& logits, Tensor& row_max) {
  const std::int64_t Vl = logits.dim(-1), rows = row_max.numel();
  dispatch_real("ops::vocab_parallel_max", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (std::int64_t n = 0; n < rows; ++n) {
      const T* x = logits.data_as<T>() + n * Vl;
      T m = x[0];
      for (std::int64_t j = 1; j < Vl; ++j) m = x[j] > m ? x[j] : m;
      row_max.data_as<T>()[n] = m;
    }
  });
}

void vocab_parallel_sums(Context&, const Tensor& logits, const Tensor& targets, std::int64_t vocab_begin,
                         const Tensor& row_max, Tensor& sums) {
  const std::int64_t Vl = logits.dim(-1), rows = row_max.numel();
  const std::int32_t* tgt = targets.data_as<std::int32_t>();
  dispatch_real("ops::vocab_parallel_sums", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (std::int64_t n = 0; n < rows; ++n) {
      const T* x = logits.data_as<T>() + n * Vl;
      const T m = row_max.data_as<T>()[n];
      double s = 0;
      for (std::int64_t j = 0; j < Vl; ++j) s += static_cast<double>(std::exp(x[j] - m));
      const std::int64_t local = tgt[n] - vocab_begin;
      sums.data_as<T>()[2 * n] = static_cast<T>(s);
      sums.data_as<T>()[2 * n + 1] = local >= 0 && local < Vl ? x[local] : T(0);
    }
  });
}

void vocab_parallel_loss(Context&, const Tensor& logits, const Tensor& targets, std::int64_t vocab_begin,
                         const Tensor& row_max, const Tensor& sums, Tensor& loss_sum, Tensor* dlogits,
                         double grad_scale) {
  const std::int64_t Vl = logits.dim(-1), rows = row_max.numel();
  const std::int32_t* tgt = targets.data_as<std::int32_t>();
  dispatch_real("ops::vocab_parallel_loss", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    double total = 0;
    for (std::int64_t n = 0; n < rows; ++n) {
      const T m = row_max.data_as<T>()[n];
      const T S = sums.data_as<T>()[2 * n], x_target = sums.data_as<T>()[2 * n + 1];
      // lse = M + log S, as ops::cross_entropy computes it (max-subtracted: no overflow).
      const double lse = static_cast<double>(m) + std::log(static_cast<double>(S));
      total += lse - static_cast<double>(x_target);
      if (!dlogits) continue;
      const T* x = logits.data_as<T>() + n * Vl;
      T* d = dlogits->data_as<T>() + n * Vl;
      const T lse_t = static_cast<T>(lse), gs = static_cast<T>(grad_scale);
      for (std::int64_t j = 0; j < Vl; ++j) d[j] = std::exp(x[j] - lse_t) * gs;
      const std::int64_t local = tgt[n] - vocab_begin;
      if (local >= 0 && local < Vl) d[local] -= gs;
    }
    loss_sum.data_as<T>()[0] = static_cast<T>(total);
  });
}

}  // namespace lmscale::ops::cpu
