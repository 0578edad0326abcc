#pragma once
// Element-wise reductions of host buffers for the ring and shared-memory algorithms and for the
// finishing step of the library path. bf16/fp16 accumulate in fp32 and are rounded once at the
// end; integer sums wrap around (two's complement) instead of being undefined.
#include <cstddef>

#include "lmscale/comm/types.h"
#include "lmscale/core/dtype.h"

namespace lmscale::comm::detail {

// fp32 for bf16/fp16, the type itself otherwise.
DType accumulation_dtype(DType t);

// out[i] = finish(in[0][i] op in[1][i] op ... op in[m-1][i]) for i < n, combined in the order of
// `in`, in accumulation_dtype(t); finish divides by group_size for avg. out2, when not null,
// receives the same values. out may alias in[k] element for element.
void reduce_into(DType t, ReduceOp op, int group_size, void* out, void* out2, const void* const* in, int m,
                 std::size_t n);

// acc[i] = acc[i] op convert(src[i]); acc is of acc_t = accumulation_dtype(src_t) (src_t may be acc_t).
void accumulate(DType acc_t, void* acc, DType src_t, const void* src, ReduceOp op, std::size_t n);

// dst[i] = convert(finish(acc[i])) from acc_t to dst_t (finish divides by group_size for avg).
void finish(DType acc_t, const void* acc, DType dst_t, void* dst, ReduceOp op, int group_size, std::size_t n);

// dst[i] = convert(src[i]) from a communicated type to its accumulation type (or the same type).
void widen(DType src_t, const void* src, DType dst_t, void* dst, std::size_t n);

}  // namespace lmscale::comm::detail
