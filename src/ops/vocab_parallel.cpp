// ops::embedding_shard*, ops::vocab_parallel_*: shape, dtype and device checks, then dispatch.
// ids/targets int32 with N elements; table/dtable [Vl, d] with rows [N, d]; logits [..., Vl]
// (N rows); row_max [N], sums [N, 2], loss_sum [1] in the statistics dtype of the logits.
#include "lmscale/ops/vocab_parallel.h"

#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"

namespace lmscale::ops {
namespace {

void check_table_rows(const char* op, const char* name, const Tensor& rows, const Tensor& ids, const Tensor& table,
                      std::int64_t vocab_begin) {
  LMSCALE_CHECK(table.ndim() == 2, "{}: table must be [Vl, d], got {}", op, shape_str(table.shape()));
  LMSCALE_CHECK(vocab_begin >= 0, "{}: vocab_begin {} < 0", op, vocab_begin);
  detail::check_dtype(op, "ids", ids, DType::i32);
  detail::check_floating(op, name, rows);
  detail::check_floating(op, "table", table);
  LMSCALE_CHECK(rows.ndim() >= 1 && rows.dim(-1) == table.dim(1) && rows.numel() == ids.numel() * table.dim(1),
                "{}: '{}' {} must hold one row of d={} per id ({} ids)", op, name, shape_str(rows.shape()),
                table.dim(1), ids.numel());
}

// The checks every cross-entropy step shares; returns N.
std::int64_t check_logits(const char* op, const Tensor& logits, const Tensor& row_max) {
  detail::check_floating(op, "logits", logits);
  const std::int64_t rows = detail::rows_of(op, "logits", logits);
  LMSCALE_CHECK(logits.dim(-1) > 0, "{}: logits {} has an empty vocabulary dimension", op, shape_str(logits.shape()));
  detail::check_numel(op, "row_max", row_max, rows);
  detail::check_dtype(op, "row_max", row_max, detail::stats_dtype(logits.dtype()));
  return rows;
}

void check_targets(const char* op, const Tensor& targets, std::int64_t rows, std::int64_t vocab_begin) {
  detail::check_dtype(op, "targets", targets, DType::i32);
  detail::check_numel(op, "targets", targets, rows);
  LMSCALE_CHECK(vocab_begin >= 0, "{}: vocab_begin {} < 0", op, vocab_begin);
}

}  // namespace

void embedding_shard(Context& ctx, const Tensor& ids, const Tensor& table, std::int64_t vocab_begin, Tensor& out) {
  constexpr const char* op = "ops::embedding_shard";
  const Device dev = detail::common_device(op, {{"ids", &ids}, {"table", &table}, {"out", &out}});
  check_table_rows(op, "out", out, ids, table, vocab_begin);
  detail::check_same_dtype(op, "table", table, "out", out);
  if (dev == Device::cpu) return cpu::embedding_shard(ctx, ids, table, vocab_begin, out);
#ifdef LMSCALE_WITH_CUDA
  return cuda::embedding_shard(ctx, ids, table, vocab_begin, out);
#else
  detail::no_cuda_build(op);
#endif
}

void embedding_shard_backward(Context& ctx, const Tensor& ids, const Tensor& dout, std::int64_t vocab_begin,
                              Tensor& dtable) {
  constexpr const char* op = "ops::embedding_shard_backward";
  const Device dev = detail::common_device(op, {{"ids", &ids}, {"dout", &dout}, {"dtable", &dtable}});
  check_table_rows(op, "dout", dout, ids, dtable, vocab_begin);
  if (dev == Device::cpu) return cpu::embedding_shard_backward(ctx, ids, dout, vocab_begin, dtable);
#ifdef LMSCALE_WITH_CUDA
  return cuda::embedding_shard_backward(ctx, ids, dout, vocab_begin, dtable);
#else
  detail::no_cuda_build(op);
#endif
}

void vocab_parallel_max(Context& ctx, const Tensor& logits, Tensor& row_max) {
  constexpr const char* op = "ops::vocab_parallel_max";
  const Device dev = detail::common_device(op, {{"logits", &logits}, {"row_max", &row_max}});
  check_logits(op, logits, row_max);
  if (dev == Device::cpu) return cpu::vocab_parallel_max(ctx, logits, row_max);
#ifdef LMSCALE_WITH_CUDA
  return cuda::vocab_parallel_max(ctx, logits, row_max);
#else
  detail::no_cuda_build(op);
#endif
}

void vocab_parallel_sums(Context& ctx, const Tensor& logits, const Tensor& targets, std::int64_t vocab_begin,
                         const Tensor& row_max, Tensor& sums) {
  constexpr const char* op = "ops::vocab_parallel_sums";
  const Device dev = detail::common_device(
      op, {{"logits", &logits}, {"targets", &targets}, {"row_max", &row_max}, {"sums", &sums}});
  const std::int64_t rows = check_logits(op, logits, row_max);
  check_targets(op, targets, rows, vocab_begin);
  detail::check_numel(op, "sums", sums, 2 * rows);
  detail::check_same_dtype(op, "row_max", row_max, "sums", sums);
  if (dev == Device::cpu) return cpu::vocab_parallel_sums(ctx, logits, targets, vocab_begin, row_max, sums);
#ifdef LMSCALE_WITH_CUDA
  return cuda::vocab_parallel_sums(ctx, logits, targets, vocab_begin, row_max, sums);
#else
  detail::no_cuda_build(op);
#endif
}

void vocab_parallel_loss(Context& ctx, const Tensor& logits, const Tensor& targets, std::int64_t vocab_begin,
                         const Tensor& row_max, const Tensor& sums, Tensor& loss_sum, Tensor* dlogits,
                         double grad_scale) {
  constexpr const char* op = "ops::vocab_parallel_loss";
  const Device dev = detail::common_device(op, {{"logits", &logits},
                                                {"targets", &targets},
                                                {"row_max", &row_max},
                                                {"sums", &sums},
                                                {"loss_sum", &loss_sum},
                                                {"dlogits", dlogits}});
  const std::int64_t rows = check_logits(op, logits, row_max);
  check_targets(op, targets, rows, vocab_begin);
  detail::check_numel(op, "sums", sums, 2 * rows);
  detail::check_same_dtype(op, "row_max", row_max, "sums", sums);
  detail::check_numel(op, "loss_sum", loss_sum, 1);
  detail::check_same_dtype(op, "row_max", row_max, "loss_sum", loss_sum);
  if (dlogits) {
    detail::check_shape(op, "dlogits", *dlogits, logits.shape());
    detail::check_same_dtype(op, "logits", logits, "dlogits", *dlogits);
  }
  if (dev == Device::cpu)
    return cpu::vocab_parallel_loss(ctx, logits, targets, vocab_begin, row_max, sums, loss_sum, dlogits, grad_scale);
#ifdef LMSCALE_WITH_CUDA
  return cuda::vocab_parallel_loss(ctx, logits, targets, vocab_begin, row_max, sums, loss_sum, dlogits, grad_scale);
#else
  detail::no_cuda_build(op);
#endif
}

}  // namespace lmscale::ops
