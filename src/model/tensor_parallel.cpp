// The local parameter layout of a tensor-parallel rank and the mapping between a slice and its
// full parameter (model/tensor_parallel.h).
#include "lmscale/model/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "lmscale/core/allocator.h"
#include "lmscale/core/error.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/ops/ops.h"

namespace lmscale::model {

namespace {

// Elements of one index of the leading axis: a matrix's columns, a stacked expert tensor's matrix.
std::int64_t row_elements(const Shape& full) {
  std::int64_t n = 1;
  for (std::size_t i = 1; i < full.size(); ++i) n *= full[i];
  return n;
}

// How each parameter of parameter_layout is split: rows, columns or not at all.
int split_dim_of(const ParamInfo& p) {
  const std::string& n = p.name;
  auto ends = [&](const char* suffix) {
    const std::size_t k = std::strlen(suffix);
    return n.size() >= k && n.compare(n.size() - k, k, suffix) == 0;
  };
  if (p.kind == ParamInfo::Kind::norm) return -1;
  if (p.kind == ParamInfo::Kind::embedding || ends("lm_head.weight")) return 0;   // vocabulary rows
  if (ends("q_proj.weight") || ends("k_proj.weight") || ends("v_proj.weight") || ends("w1.weight") ||
      ends("w3.weight"))
    return 0;   // column-parallel: output features
  if (ends("output_proj.weight") || ends("w2.weight")) return 1;   // row-parallel: input features
  throw Error("tensor_parallel_layout: no split rule for parameter " + n);
}

}  // namespace

std::vector<ParamInfo> tensor_parallel_layout(const ModelDims& dims, const TensorSplit& split) {
  std::vector<ParamInfo> v = parameter_layout(dims);
  if (!split.active()) return v;
  LMSCALE_CHECK(split.rank >= 0 && split.rank < split.degree, "tensor parallel rank {} of {}", split.rank, split.degree);
  LMSCALE_CHECK(dims.heads % split.degree == 0 && dims.d_ff % split.degree == 0 && dims.vocab % split.degree == 0,
                "tensor parallel degree {} must divide heads {}, d_ff {} and vocab {}", split.degree, dims.heads,
                dims.d_ff, dims.vocab);
  std::int64_t off = 0;
  for (ParamInfo& p : v) {
    p.split_dim = split_dim_of(p);
    if (p.split_dim >= 0) {
      const auto dim = static_cast<std::size_t>(p.split_dim);
      // Heads are contiguous blocks of Dh rows (q/k/v) or columns (output_proj), so an equal
      // split of d_model is a split of whole heads.
      p.split_begin = split.begin(p.full_shape[dim]);
      p.shape[dim] = split.local(p.full_shape[dim]);
      p.numel = shape_numel(p.shape);
    }
    p.offset = off;
    off += p.numel;
  }
  return v;
}

void copy_slice(const ParamInfo& local, void* full, void* slice, std::size_t elem_bytes, bool to_full) {
  auto* f = static_cast<char*>(full);
  auto* s = static_cast<char*>(slice);
  auto move = [&](std::int64_t full_elem, std::int64_t slice_elem, std::int64_t count) {
    char* a = f + static_cast<std::size_t>(full_elem) * elem_bytes;
    char* b = s + static_cast<std::size_t>(slice_elem) * elem_bytes;
    const std::size_t bytes = static_cast<std::size_t>(count) * elem_bytes;
    if (to_full) std::memcpy(a, b, bytes);
    else std::memcpy(b, a, bytes);
  };
  if (local.split_dim < 0) return move(0, 0, local.numel);
  const std::int64_t cols = row_elements(local.full_shape);
  if (local.split_dim == 0) return move(local.split_begin * cols, 0, local.numel);   // contiguous rows
  const std::int64_t rows = local.shape[0], lc = local.shape[1];
  for (std::int64_t i = 0; i < rows; ++i) move(i * cols + local.split_begin, i * lc, lc);
}

void fill_slice_initial_values(const ParamInfo& local, std::uint64_t seed, Tensor dst, Context& ctx) {
  fill_slice_initial_values(local, seed, 0, local.numel, dst, ctx);
}

void fill_slice_initial_values(const ParamInfo& local, std::uint64_t seed, std::int64_t begin, std::int64_t end,
                               Tensor dst, Context& ctx) {
  LMSCALE_CHECK(0 <= begin && begin <= end && end <= local.numel && dst.numel() == end - begin,
                "fill_slice_initial_values: [{}, {}) of {} into {} elements", begin, end, local.numel, dst.numel());
  if (begin == end) return;
  if (local.split_dim < 0) return fill_initial_values(local, seed, begin, end, dst, ctx);
  const std::int64_t cols = row_elements(local.full_shape);
  if (local.split_dim == 0) {   // contiguous rows: one range of the full parameter
    const std::int64_t b = local.split_begin * cols;
    return fill_initial_values(local, seed, b + begin, b + end, dst, ctx);
  }
  // Columns [c0, c0 + lc) of every row: local element j of row i is full element i cols + c0 + j.
  // Computed on the host in fp64 by several threads, a block of rows at a time (<= 16 Mi elements
  // of staging), then converted and copied; the first and last rows may be partial.
  const std::int64_t lc = local.shape[1], c0 = local.split_begin;
  const std::int64_t first_row = begin / lc, end_row = (end + lc - 1) / lc;
  const std::int64_t block_rows = std::max<std::int64_t>(1, std::min(end_row - first_row, (std::int64_t{1} << 24) / lc));
  HostAllocator staging_alloc;
  Tensor staging64 = Tensor::empty({block_rows * lc}, DType::f64, staging_alloc, "init_staging");
  Tensor staging =
      dst.dtype() == DType::f64 ? staging64 : Tensor::empty({block_rows * lc}, dst.dtype(), staging_alloc, "init_staging");
  Context host_ctx;
  host_ctx.device = Device::cpu;
  host_ctx.allocator = &staging_alloc;
  host_ctx.host = &staging_alloc;
  const unsigned nthreads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (std::int64_t r0 = first_row; r0 < end_row; r0 += block_rows) {
    const std::int64_t nr = std::min(block_rows, end_row - r0);
    // Local elements [lo, hi) of this block of rows, written to staging from its start.
    const std::int64_t lo = std::max(begin, r0 * lc), hi = std::min(end, (r0 + nr) * lc);
    double* out = staging64.data_as<double>();
    std::vector<std::thread> workers;
    const std::int64_t per = (nr + nthreads - 1) / nthreads;
    for (unsigned t = 0; t < nthreads; ++t) {
      const std::int64_t a = t * per, b = std::min(nr, a + per);
      if (a >= b) break;
      workers.emplace_back([&, a, b] {
        for (std::int64_t i = a; i < b; ++i) {
          const std::int64_t row = r0 + i;
          const std::int64_t x = std::max(lo, row * lc), y = std::min(hi, (row + 1) * lc);   // local
          if (x >= y) continue;
          const std::int64_t g = row * cols + c0 + (x - row * lc);
          initial_values(local, seed, g, g + (y - x), out + (x - lo));
        }
      });
    }
    for (auto& w : workers) w.join();
    Tensor src64 = staging64.flat_range(0, hi - lo);
    Tensor src = staging.flat_range(0, hi - lo);
    if (staging.dtype() != DType::f64) ops::cast(host_ctx, src64, src);
    Tensor part = dst.flat_range(lo - begin, hi - lo);
    ops::copy(ctx, src, part);
  }
}

}  // namespace lmscale::model
