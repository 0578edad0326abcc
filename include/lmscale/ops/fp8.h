#pragma once
// FP8 building blocks (docs/precision.md): the amax reduction, the scaled saturating cast into
// e4m3/e5m2, the byte transpose that makes the GEMMs' transposed operands, the per-tensor scale
// update, and the FP8 GEMM of the linear layers. CPU implementations are the references the CUDA
// kernels are tested against (bitwise for everything but the GEMM, whose reference multiplies the
// decoded operands in fp64). Tensors are contiguous and row-major, as in ops.h; every scale,
// inverse scale and amax is a 1-element fp32 tensor on the device of the data, so nothing here
// reads the device from the host.
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/fp8.h"
#include "lmscale/core/tensor.h"

namespace lmscale::ops {

// out (1 element, fp32) = max |x| over every element of x (fp32, bf16, fp16; fp64 too on CPU,
// rounded to fp32 first). NaN anywhere in x makes it NaN (the canonical quiet NaN); an empty x
// gives 0. Overwrites out.
void amax(Context& ctx, const Tensor& x, Tensor& out);

// Delayed scaling's scale update fused into a cast (Fp8TensorScaling): before the cast reads x,
// scale and inv_scale are set from amax_history by fp8_update_scale's rule (the cast uses the new
// scale); when record_slot >= 0, max |x| (as ops::amax computes it) is written into
// amax_history[record_slot] after (the update read the entry it replaces). work: [2] int32 on
// the data's device, zero before and after every call (the CUDA kernels' amax accumulator and
// finished-block counter: the last block to finish stores the amax; no other launch is needed).
struct Fp8HistoryUpdate {
  Tensor amax_history;          // [H] fp32
  std::int64_t record_slot = -1;
  Fp8Format format = Fp8Format::e4m3;
  int margin = 0;
  Tensor inv_scale;             // [1] fp32, receives 2^-k with the scale's 2^k
  Tensor work;                  // [2] int32 zeros
  // CUDA (optional): [1] int32 on the device holding the slot to record into, which the cast
  // advances (mod H) after recording; record_slot >= 0 then only says "record". A captured train
  // step replays the same launches every step (train.cuda_graphs), so the slot cannot be a launch
  // argument. Ignored by the CPU, which records at record_slot.
  Tensor slot = Tensor();
};

// Current scaling's first pass with its scale update fused: amax_history[slot] = max |x| (as
// ops::amax), then scale and inv_scale from the whole history (fp8_update_scale). One kernel on
// CUDA, whose last block to finish stores the amax and updates the scale. work as in
// Fp8HistoryUpdate.
void fp8_amax_update_scale(Context& ctx, const Tensor& x, Tensor& amax_history, std::int64_t slot, Fp8Format format,
                           int margin, Tensor& scale, Tensor& inv_scale, Tensor& work);

// out = fp8(fp32(x) * scale), out's dtype e4m3 or e5m2, same element count as x (dtypes as in
// amax). The product is rounded to fp32 and then to the nearest fp8 value (ties to even), with
// the satfinite overflow rule of core/fp8.h: beyond +-fp8_max (inf included) it saturates, NaN
// stays NaN (0x7F). scale: 1 element fp32 (the quantisation scale; a GEMM reading out multiplies
// by its inverse). With the power-of-two scales of fp8_update_scale the product is exact, so the
// only rounding is the one to fp8. When amax_out (1 element fp32) is given it receives max |x|
// exactly as ops::amax computes it, in the same pass over x. With `update` (delayed scaling) the
// scale is first set from its history (Fp8HistoryUpdate: `scale` is written) and amax_out must be
// null (the update records the amax).
void cast_fp8(Context& ctx, const Tensor& x, const Tensor& scale, Tensor& out, Tensor* amax_out,
              const Fp8HistoryUpdate* update = nullptr);

// The cast and the transpose of a 2-D x [M,K] from one read of x: out [M,K] = fp8(x * scale) as
// cast_fp8 makes it and out_t [K,M] = its transpose as transpose_fp8 makes it, either null (not
// both; without out_t this is cast_fp8). One kernel on CUDA, through 128 x 64 or 64 x 64 tiles in shared
// memory so that x, out and out_t are each read or written in whole rows. update as in cast_fp8
// (delayed scaling: the scale from the history first, x's amax recorded after).
void cast_transpose_fp8(Context& ctx, const Tensor& x, const Tensor& scale, Tensor* out, Tensor* out_t,
                        const Fp8HistoryUpdate* update = nullptr);

// Casts fused into their producers (docs/precision.md, "Casts fused into the producers"): the
// producer's output is never stored in the compute dtype; its codes out [rows, C] (may be null)
// and their transpose out_t [C, rows] are, bitwise what cast_transpose_fp8 makes from the output
// the plain producer (ops::swiglu_rows, ops::swiglu_rows_backward) writes, under the same scale
// and update (its amax recorded alike). Meant for delayed scaling, whose scale is known before the
// pass. One kernel on CUDA where rows and cols are multiples of 8 and the rows 16-byte aligned;
// elsewhere (and on the CPU) the plain producer into a temporary, then the cast.
// SwiGLU: h = silu(a) * b with a, b as in ops::swiglu_rows; C = cols.
// The shapes the one-kernel form takes (besides aligned rows): whole 8-element groups, rows and
// cols multiples of 8. Shared by the CUDA kernels and the allocation replay, which counts the
// fallback's temporary elsewhere.
inline bool fp8_cast_kernel_shape(std::int64_t rows, std::int64_t cols) { return rows % 8 == 0 && cols % 8 == 0; }
void swiglu_cast_transpose_fp8(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols,
                               std::int64_t ld, const Tensor& scale, Tensor* out, Tensor& out_t,
                               const Fp8HistoryUpdate* update = nullptr);
// SwiGLU's backward as ops::swiglu_rows_backward from dh [rows, cols], da and db side by side as
// one [rows, 2 cols] matrix (da in columns [0, cols), db after: the model's da|db, the w1|w3
// layer's dy); C = 2 cols, and a, b must be the column blocks of one [rows, 2 cols] a|b (ld = 2 cols).
void swiglu_backward_cast_transpose_fp8(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows,
                                        std::int64_t cols, std::int64_t ld, const Tensor& dh, const Tensor& scale,
                                        Tensor* out, Tensor& out_t, const Fp8HistoryUpdate* update = nullptr);

// FP8 GEMM weights cast by the optimizer step (delayed scaling; docs/precision.md, "Weights cast
// by the optimizer step"). The AdamW pass that updates a weight [R, K] (elements [offset, offset +
// R K) of its parameter range, row-major) also writes q [R, K] = fp8(w * scale) and its transpose
// qt [K, R] (through 64 x 64 tiles, so R and K are multiples of 64), with w the updated parameter
// rounded to the compute dtype first: bitwise what ops::cast_transpose_fp8 makes of the working
// copy a plain step would have written (which the casting step does not write for these
// elements). max |w| goes to pending_amax; fp8_weight_casts_begin records it into the history
// before the next cast's scale is derived, which is when delayed scaling's forward cast would
// have recorded it. A layer then reads q and qt as they are (ops::Fp8Linear::forward with an
// Fp8Weight), so the forward casts nothing.
struct Fp8WeightCast {
  std::int64_t offset = 0;          // the weight's first element in the step's parameter range
  std::int64_t rows = 0, cols = 0;  // R, K
  Tensor q, qt;                     // [R, K] and [K, R] e4m3 on the device
  Tensor scale;                     // [1] fp32: the weight scaling's scale (its inverse: history.inv_scale)
  Tensor pending_amax;              // [1] fp32: the last cast's amax, not yet recorded
  Fp8HistoryUpdate history;         // the weight scaling's amax_history, format (e4m3), margin,
                                    // inv_scale and device record slot (work, record_slot unused)
};
// The weights' first step (CUDA, one launch per 128 casts): when `commit`, each pending amax goes into
// its history at the device record slot (advanced); then every scale and inverse is set from its
// history (fp8_update_scale's rule) and the pending amax is zeroed. Run before each casting pass.
void fp8_weight_casts_begin(Context& ctx, const std::vector<Fp8WeightCast>& casts, bool commit);
// The casts alone, from the parameters `param` (fp32, the step's range) rounded to `rounding` (the
// compute dtype): what a step writes when it updates nothing (the first step's casts before any
// update, a skipped step's). fp8_weight_casts_begin first.
void fp8_weight_casts(Context& ctx, const Tensor& param, DType rounding, const std::vector<Fp8WeightCast>& casts);
// Whether a weight [rows, cols] can be cast so (the 64 x 64 tiles).
inline bool fp8_weight_cast_shape(std::int64_t rows, std::int64_t cols) {
  return rows > 0 && cols > 0 && rows % 64 == 0 && cols % 64 == 0;
}

// out[C,R] = x[R,C]^T for 2-D fp8 tensors (a byte copy: exact). The FP8 GEMMs need their
// operands K-major (ops::linear_fp8), so the backward's x^T, dy^T and w^T come from here.
void transpose_fp8(Context& ctx, const Tensor& x, Tensor& out);

// out[i * stride] = sources[i] (each one fp32 element) for the at most kMaxGathered sources, in
// one launch on CUDA (a linear layer's four saved scales, Fp8LinearSaved); the elements between
// are not written. out: fp32 with at least (sources - 1) * stride + 1 elements.
inline constexpr int kMaxGathered = 8;
void gather_scalars(Context& ctx, std::initializer_list<const Tensor*> sources, Tensor& out, std::int64_t stride);

// The per-tensor scale from an amax history (fp32 [H], H >= 1; current scaling passes [1] holding
// the amax of the tensor now):
//   a = max over the history, NaN entries skipped;
//   scale = 2^k with k the largest integer such that a * 2^k <= fp8_max(format), minus margin,
//           clamped to [-126, 126]; inv_scale = 2^-k (both exact: the cast's product and the
//           GEMM's dequantisation add no rounding);
//   when a is 0, inf or every entry is NaN, scale and inv_scale keep their values (the first
//   steps of delayed scaling keep the initial 1).
// A power of two at most 2x below fp8_max / a loses no relative precision (a float format's
// relative spacing does not depend on the scale) and at most one binade at the subnormal end.
void fp8_update_scale(Context& ctx, const Tensor& amax_history, Fp8Format format, int margin, Tensor& scale,
                      Tensor& inv_scale);

// How an FP8 GEMM accumulates on CUDA (docs/precision.md, "Error bounds"). promoted: cuBLASLt's
// default, the tensor cores' reduced-precision partial sums added into fp32 at intervals (Transformer
// Engine's "split accumulator"). fast: CUBLASLT_MATMUL_DESC_FAST_ACCUM, never promoted: faster,
// with an error that grows with K. The peers run the forward product fast and the two gradient
// products promoted (precision.fp8_fast_accum = forward).
enum class Fp8Accumulation { promoted, fast };

// The FP8 GEMM of a linear layer ("TN": both operands K-major, the only layout Hopper's FP8
// tensor-core GEMMs take):
//   y[M,N] (+)= (a[M,K] * a_inv) . (b[N,K] * b_inv)^T
// a, b: e4m3 or e5m2 (not both e5m2); a_inv, b_inv: their inverse scales (1 element fp32);
// y: bf16 or fp32 on CUDA (fp32 or fp64 on CPU); accumulate adds into y (fp32 y only on CUDA).
// fp32 accumulation on CUDA (`accumulation` says how), fp64 on CPU: the CPU reference cannot
// emulate the tensor cores' reduced accumulator and ignores `accumulation` (the same result for
// both). On CUDA K must be a multiple of 16 and every operand 16-byte aligned (cuBLASLt's FP8
// rule); the call says which operand is not.
// The three products of a linear layer y = x w^T are this one product:
//   forward    y[M,N]  = x_q[M,K]   . w_q[N,K]^T
//   data grad  dx[M,K] = dy_q[M,N]  . wt_q[K,N]^T    (wt_q = transpose_fp8(w_q))
//   weight grad dw[N,K] (+)= dyt_q[N,M] . xt_q[K,M]^T (dyt_q, xt_q: transposes of dy_q, x_q)
void linear_fp8(Context& ctx, const Tensor& a, const Tensor& a_inv, const Tensor& b, const Tensor& b_inv, Tensor& y,
                bool accumulate, Fp8Accumulation accumulation = Fp8Accumulation::promoted);

}  // namespace lmscale::ops
