// ops::embedding and ops::embedding_backward: shape, dtype and device checks, then dispatch.
// ids may have any shape; out and dout are rows of d matching ids element for element
// ([N] ids with [N, d] rows, or [B, T] ids with [B, T, d] or [B*T, d] rows).
#include "checks.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops {
namespace {

void check_rows(const char* op, const char* name, const Tensor& rows, const Tensor& ids, const Tensor& table) {
  LMSCALE_CHECK(table.ndim() == 2, "{}: table must be [V, d], got {}", op, shape_str(table.shape()));
  detail::check_dtype(op, "ids", ids, DType::i32);
  detail::check_floating(op, name, rows);
  detail::check_floating(op, "table", table);
  LMSCALE_CHECK(rows.ndim() >= 1 && rows.dim(-1) == table.dim(1) && rows.numel() == ids.numel() * table.dim(1),
                "{}: '{}' {} must hold one row of d={} per id ({} ids {})", op, name, shape_str(rows.shape()),
                table.dim(1), ids.numel(), shape_str(ids.shape()));
}

}  // namespace

void embedding(Context& ctx, const Tensor& ids, const Tensor& table, Tensor& out) {
  constexpr const char* op = "ops::embedding";
  const Device dev = detail::common_device(op, {{"ids", &ids}, {"table", &table}, {"out", &out}});
  check_rows(op, "out", out, ids, table);
  detail::check_same_dtype(op, "table", table, "out", out);
  if (dev == Device::cpu) return cpu::embedding(ctx, ids, table, out);
#ifdef LMSCALE_WITH_CUDA
  return cuda::embedding(ctx, ids, table, out);
#else
  detail::no_cuda_build(op);
#endif
}

void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  constexpr const char* op = "ops::embedding_backward";
  const Device dev = detail::common_device(op, {{"ids", &ids}, {"dout", &dout}, {"dtable", &dtable}});
  check_rows(op, "dout", dout, ids, dtable);
  if (dev == Device::cpu) return cpu::embedding_backward(ctx, ids, dout, dtable);
#ifdef LMSCALE_WITH_CUDA
  return cuda::embedding_backward(ctx, ids, dout, dtable);
#else
  detail::no_cuda_build(op);
#endif
}

}  // namespace lmscale::ops
